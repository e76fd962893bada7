// Command meshfold is meshfold's one binary: it wires flags to the
// libraries and prints, for every role (serve, reconcile, node, provision,
// console) and every verb of the controller and the operator (want, apply,
// approve, rollout, secret, audit, state, fleet and the rest). The rules
// live in packages reconcile and rollout, the JetStream code in store, the
// reads in query.
//
// Every verb is a cobra command built by a function of this package, so
// the CLI runs in tests without a process: see [newRoot].
package main
