// Package reconciletest is the test support of meshfold's pure core, as
// raft has rafttest: the one simulator of the fold, and the one handler of
// the scripts' input commands.
//
// [Stream] builds node histories the way the real stream holds them, with
// the fold itself: every input event appended to it is folded into its
// node's state, and the effects the fold returns (plans, knocks,
// journals) are appended right after it, as a reconciler that publishes
// at once would. Plans are folded back, as the reconciler folds its own
// plan events. [Stream.Effects] gives the effects of each event, and
// [Stream.Trim] lets a long history keep only its states. [Scripted]
// makes a long, varied history from a seed. The property tests and
// scripts of reconcile and reconcile/audit, engine/enginetest's
// histories, the console's and the CLI's tests fold through it.
//
// [Script] appends the event of a datadriven script's input command (the
// scripts of reconcile and of reconcile/audit share it); [Lines], [U64]
// and [WantModule] read the scripts' lines.
//
// Like package reconcile it is pure: no I/O, no clock, no NATS, no
// goroutine (times are computed from a base time and the sequence), so a
// history is the same on every run.
package reconciletest
