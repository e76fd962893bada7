// Package engine is the reconciler's engine (DESIGN.md §7): the loop that
// reads each owned partition of the stream in order, drives the pure fold
// of package reconcile and carries out its effects exactly once
// ([Reconciler]); the group that shares partitions between instances
// through leases ([Group]); the state service's serving half
// ([AddStateService]; its client half is package query's); and the
// loop's Prometheus metrics ([Metrics]). It reaches JetStream only
// through package store.
//
// [Serve] is the reconciler's whole lifecycle in one call, as
// controller-runtime's manager.Start is: the stream and its buckets, the
// stream lease or the group's membership, the metrics and profiles
// endpoint, the state service, the fold with its snapshots, and a
// graceful stop. `meshfold serve`, `meshfold reconcile`, the demo and the
// e2e tests start the reconciler through it.
//
// Only the reconciler's processes (`meshfold serve`, `meshfold reconcile`,
// the demo) link it: node agents and provisioner clients import store
// alone, so they carry neither the engine nor Prometheus (a test in store
// checks it).
//
// # Errors
//
// Sentinels: [ErrReleased] and [ErrLeaseLost] (why a [Grant] was revoked),
// [ErrBesideGroup] and [ErrBesideUngrouped] (another reconciler folds the
// stream), [ErrStreamLeaseLost] and [ErrMetricsListen] (why [Serve]
// stopped or could not start; a closed connection is store.ErrConnClosed).
package engine
