// Package audit explains one node's history: the timeline of its events,
// its folded state as of any sequence or time, and why each plan, hold,
// knock and journal entry happened. It replays the node's events through
// the very fold the reconciler runs ([reconcile.State.Fold]); it never
// implements a rule of its own, so the audit cannot disagree with the
// reconciler about what the rules decided.
//
// The caller reads the node's events from the stream (query.Reader.History),
// in stream order, and hands them over as a [History]. Everything here is
// then a pure function of those events: no NATS, no clock (the present
// arrives as an argument where an age is shown), no I/O, no goroutine. A
// test fails if that ever changes.
//
// # What it offers
//
//   - [History.Timeline]: one [Entry] per event with a short summary; an
//     entry's [Entry.Line] fits 100 columns.
//   - [History.AsOf]: the state after folding every event at or before a
//     [Bound] (a stream sequence, or a time: events whose stream time is
//     at or before it). Two events with the same stream time are both in
//     or both out. A time bound covers the whole unit it is written in:
//     "20:50:05Z" takes every event of that second, "20:50:05.120Z" every
//     event of that millisecond, so a time copied from the timeline
//     includes the event it was copied from. A bound that falls between
//     events is said so in the result's Note.
//   - [History.Why]: the chain of earlier events that made a knock (each
//     owed item's refusal, the plan that accepts it and the want that
//     declared the path, the event that triggered it), a plan (its cause,
//     its want, each held row's reason, the approvals that exist) or a
//     journal entry (its cause), built from the replayed events and the
//     fold's results.
//   - [StateText], [FleetRowOf] and [SortFleet]: the views
//     of `meshfold state` and `meshfold fleet`, computed here so that the
//     reconciler's service and the snapshot fallback show the same thing.
//
// Nothing here reads or prints filled-file content: the stream never holds
// it (DESIGN.md §5.5), and a filled event's digest is left out of every
// summary.
package audit
