// Command meshfold is the one binary of meshfold: the reconciler (serve,
// reconcile), the node agent (node), the provisioner client (provision),
// the controller and operator verbs (want, approve) and the operator's
// views (audit, state, fleet). It wires the libraries and prints; the
// rules live in package reconcile, the JetStream code in package store.
//
// Every verb is a cobra command built by a function of this package, so
// the CLI runs in tests without a process: see [newRoot].
package main
