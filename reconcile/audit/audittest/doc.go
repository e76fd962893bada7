// Package audittest builds node histories the way the real stream holds
// them, with the fold itself: every input event appended to a [Stream] is
// folded into its node's state, and the effects the fold returns (plans,
// knocks, journals) are appended right after it, as a reconciler that
// publishes at once would. Plans are folded back, as the reconciler folds
// its own plan events.
//
// The tests of reconcile/audit, the CLI's audit tests and the audit
// benchmark use it to build scripted histories; [Scripted] makes a long,
// varied one from a seed. Like package reconcile it is pure: no I/O, no
// clock, no NATS, no goroutine (times are computed from a base time and
// the sequence), so a history is the same on every run.
package audittest
