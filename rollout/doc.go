// Package rollout is meshfold's second pure core: it folds one fleet's
// rollout events and its nodes' events, in one order, into the fleet's
// rollout [State] and returns the effects to carry out as data (wants to
// publish, records to append). It implements DESIGN.md §11 "Rollouts",
// each rule in one place:
//
//   - batches, the canary and its promote, the budget: [State.Fold]'s
//     advance, with Rollout.allows the one budget rule (a target gets
//     its new want only while fewer than max_unavailable of the fleet's
//     nodes are unavailable; one already unavailable spends nothing more,
//     and one only unhealthy is changed whatever the budget), with
//     Rollout.spent what it counts (not the targets only unhealthy that
//     await their batch's turn);
//   - what makes a node unavailable (a target being changed, its agent
//     down, a module unhealthy or failed): Node.unavailable;
//   - done, failed, waiting-approval, unreached: judge, on each event of
//     the target's node and, for every target in progress, on each tick
//     (done once the plan of its new want settled and every module ran at its build, healthy,
//     for min_healthy without a break; a module without a check counts
//     while it runs; failed on an apply failure, a crash loop
//     ([CrashLoopRestarts]) or past healthy_deadline; a target whose
//     agent is down then is unreached, and never holds its batch back,
//     unless it is a canary; a have from before its agent's down starts
//     no window; a done canary is judged again until its promote, and
//     one whose agent is down, or whose have shows a restart or a
//     module not running healthy, is changing again, or failed on a
//     crash loop);
//   - a canary passes only once it ran the new build: a canary target
//     clears its batch only when done (or retired), one away (agent
//     down, node paused) holds it ([View].Waiting says so) and at its
//     healthy_deadline is unreached and halts the rollout; the canary
//     batch waits for a promote only with a target done: Rollout.clear,
//     judge and advance;
//   - a conflict (a want changed by hand, seen on the node's subject or
//     reported refused by the server): checkConflict; such a target is
//     never overwritten, not even by a revert;
//   - a target's plan its controller cannot verify (the reconciler's
//     old key, not kept; a forgery) pauses the rollout, held aside, and
//     nothing is stepped, judged or reverted until an operator resumes:
//     folder.unverified;
//   - a failure halts; a target's refusal of its plan for the
//     reconciler's key halts without auto_revert (failUntrusted);
//     auto_revert and the revert verb give every changed
//     target its previous want back (Rollout.revertWant: the want at
//     the start carries, which NewStart sets for every target within
//     its bound, else its back or prev, else none) within the budget (a target already
//     unavailable at once, the others queued until fewer than
//     max_unavailable nodes are unavailable; a revert spends it until its
//     previous want's plan settled and runs): revert, Rollout.allowsBack,
//     advanceBack, judgeBack.
//
// Package rollout/fleetfile reads the fleet file those rollouts start from.
//
// # Inputs
//
// [Input] carries one event with its stream sequence and stream time. The
// rollout's own events ([Start] and its [Nodes] pages, [Operator] verbs,
// the controller's [Published], [Refused] and [Tick], and the fold's own
// [Record] events read back) are decoded by [Decode] (see [FromRolloutEvent]);
// a node's want, plan, settle and have by package events, then
// [FromNodeEvent]. Its agent's down and up moments are Input{Kind:
// KindDown or KindUp}. The fold reads no clock: time is the stream time of
// the events, and a [Tick] says time passed.
//
// Order: the fold needs one total order of its inputs that a replay meets
// again, so the rollout's events and its nodes' events must come from one
// stream (the rollout's events on subjects of their own in it), folded in
// stream order. Two streams merged as they arrive would let a replay
// decide differently.
//
// # The caller's duties (the controller)
//
//  1. Find the fleet's newest start; fold from it, in stream order, the
//     rollout's events and the want, plan, settle, have and liveness
//     events of the nodes the start names. (`apply` publishes a start's
//     pages right after it: a node's event folded before its page is
//     not seen, and the page's status as `apply` read it stands until
//     the node's next event.)
//  2. Carry out the effects of each input in order. A [WantEffect] is
//     published on the node's want subject with [Effect.ID] as the
//     message id and Nats-Expected-Last-Subject-Sequence set to its
//     Expect (for a revert with CopyOf, the modules of the want stored at
//     that sequence); then its outcome is appended on the rollout's
//     subject, under [OutcomeID]: [Published] with the want's sequence, or
//     [Refused] with the subject's last sequence when the server refused
//     it (JetStream's atomic batch publish, where the server has it,
//     closes the window between the two). A [Record] is appended under
//     its [Effect.ID].
//  3. After a restart, fold without carrying out effects until the end of
//     the stream as it was, then publish [State.Pending]: the wants
//     decided and not recorded. Before publishing one, read the node's
//     last want: if its message id is the step's, the want was stored
//     already; record it published. Records refolded may be appended
//     again under their ids (the server's duplicate window drops them;
//     beyond it, skip records whose cause is at or below the last one
//     on the subject).
//  4. Publish a [Tick] once its clock passes [State.NextWake], at most
//     once a second.
//
// Folding an input at or below [State.Seq] changes nothing and returns
// nothing, so refolding after a restart is safe. [State.View] is the
// delivery view and [State.Why] the explanation of one node; both read
// the state only.
//
// The package reads no clock, does no I/O, starts no goroutine and imports
// no NATS; a test fails if that ever changes.
package rollout
