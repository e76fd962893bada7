// Package reconcile is meshfold's pure core: it folds one node's events, in
// stream order, into that node's [State] and returns the effects to publish
// as data. It implements the rules of DESIGN.md §4, each in one place:
//
//   - what runs: [State.Runs];
//   - compose, and the one decision whether a module is held: [Hold],
//     used by [State.Compose] and everything else that needs it (incident 4);
//   - the provisioner account: [State.Compose] (incident 3);
//   - judge a write: [Judge], which the node agent calls for every fill
//     request and the fold calls to know which settled plan accepts what;
//   - owe and knock: [State.Fold] (incidents 1 and 2).
//
// and the operator events of DESIGN.md §9, each in one place of the fold:
//
//   - pause: compose emits nothing while [State.Paused] holds; wants and
//     approvals still fold, [State.View] shows what resuming would publish
//     ([View.Withheld]), and knocks still flow;
//   - resume: ends the pause and composes once; [State.Compose] and the
//     one publishing rule decide whether a plan differs;
//   - poke: a knock with reason operator, paying nothing;
//   - revoke: removes the approval; [Hold] decides the rest (a module held
//     for it stays held, one running that build is not stopped);
//   - waive: pays the file's owed items without a knock, and owes nothing
//     for a refusal of it judged by a plan that existed at the waive
//     ([State.Waivers]), whichever arrives first;
//   - retire: compose yields an empty plan, every owed item is paid and
//     refusals owe nothing; [State.Retire] is retired once that plan
//     settles, or at once when forced; a later want clears it.
//
// and the acknowledgement of a node's journal warnings (issue 25): an ack
// keeps, in [State.Ack], the one record that covers the most; the read side
// counts warnings at or below it apart.
//
// [State.DryRun] composes a new want on a copy of the state with the
// fold's own want rule, for `meshfold want --dry-run`; [DiffPlans] tells
// how two compositions differ; [View.Stuck] derives what is stuck (a pause,
// files never filled since their module was placed, owed items older than
// an hour) from the view and a present the caller gives.
//
// The package reads no clock, does no I/O, starts no goroutine and imports
// no NATS (DESIGN.md §5.6); time arrives inside events. A test fails if that
// ever changes.
//
// # The caller's duties
//
// The shell (package engine's loop) drives the fold the way etcd's raft
// is driven through Ready:
//
//  1. Feed each node's events to its State with [State.Fold], in stream
//     order, including the reconciler's own plan events (the fold binds
//     each emitted plan to its sequence when its event arrives).
//  2. Publish the returned effects, in order, each with its [Effect.ID] as
//     the message id, and wait for their acknowledgements.
//  3. Only then checkpoint the state (its encoding/json form, read back
//     with [UnmarshalState]) with the sequence it covers. A crash before the
//     checkpoint refolds the same events and makes the same effects with
//     the same ids (DESIGN.md §5.1, §5.3).
//
// Folding an event whose sequence is not above [State.Seq] changes nothing
// and returns no effect (DESIGN.md §5.4), so refolding after a restart is
// safe.
package reconcile
