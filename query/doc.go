// Package query is meshfold's read side (DESIGN.md §7: "a read side (one
// package)"): it answers, for every reader, what a node's state is (live
// from the reconciler's state service, else its stored snapshot, else its
// events folded from the stream, saying which), what its history is (a
// read bounded by a sequence or time says it is partial), the fleet's
// snapshot views and journal warnings, the events stored from now on, and
// what a want would plan now (a dry run).
//
// The CLI's read verbs (`meshfold state`, `fleet`, `audit`, `want
// --dry-run`, the waive's notes) and the web console read only through a
// [Reader], so a rule of reading (which source wins, when a history is
// partial) is written once. A reader never writes: it creates no stream,
// bucket or durable consumer. The operator-read role of store/auth
// suffices for every read but the state service's whole folded state
// ([Reader.Fold], [Reader.DryRun]), which is the operator's. Every view
// it returns is computed by packages reconcile and reconcile/audit, the
// code the reconciler itself folds with.
//
// The state service's client half is here too ([RequestState],
// [RequestFold]); its serving half is the engine's (engine.AddStateService),
// so a reader links neither the engine's loop nor Prometheus.
//
// # Errors
//
// Sentinels: [ErrNoReconciler] (no state service answered), [ErrUnknownNode]
// (nothing is known of the node), [ErrNoSnapshots] (no reconciler has
// checkpointed yet).
package query
