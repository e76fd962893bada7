// Package engine is the reconciler's engine (DESIGN.md §7): the loop that
// reads each owned partition of the stream in order, drives the pure fold
// of package reconcile and carries out its effects exactly once
// ([Reconciler]); the group that shares partitions between instances
// through leases ([Group]); the state service ([AddStateService],
// [RequestState]); and the loop's Prometheus metrics ([Metrics]). It
// reaches JetStream only through package store.
//
// Only the reconciler's processes (`meshfold serve`, `meshfold reconcile`,
// the demo) link it: node agents and provisioner clients import store
// alone, so they carry neither the engine nor Prometheus (a test in store
// checks it).
//
// # Errors
//
// Sentinels: [ErrReleased] and [ErrLeaseLost] (why a [Grant] was revoked),
// [ErrUnknownNode] and [ErrNoReconciler] (the state service's client).
package engine
