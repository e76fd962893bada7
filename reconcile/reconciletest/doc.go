// Package reconciletest is the test support of meshfold's pure core, as
// raft has rafttest: the one simulator of the fold, and the one parser of
// the scripts' lines.
//
// [Stream] builds node histories the way the real stream holds them, with
// the fold itself: every input event appended to it is folded into its
// node's state, and the effects the fold returns (plans, knocks,
// journals) are appended right after it, as a reconciler that publishes
// at once would. Plans are folded back, as the reconciler folds its own
// plan events. [Scripted] makes a long, varied history from a seed. The
// tests of reconcile, reconcile/audit, the engine, the console and the
// CLI use it.
//
// [Lines], [U64] and [WantModule] read the lines of the datadriven
// scripts of reconcile and reconcile/audit.
//
// Like package reconcile it is pure: no I/O, no clock, no NATS, no
// goroutine (times are computed from a base time and the sequence), so a
// history is the same on every run.
package reconciletest
