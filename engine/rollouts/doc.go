// Package rollouts runs the rollout controller: for each fleet with a
// rollout in the stream, one controller at a time (a lease) folds the
// fleet's rollout events and its nodes' events, in stream order, through
// the pure core (package rollout), and carries out the effects: it
// publishes each step's want exactly once and records the outcome, the
// fold's records and the ticks (DESIGN.md §11 "Rollouts"; the duties are
// in package rollout's doc).
//
// The controller keeps no state of its own: after a kill -9 it refolds
// from the rollout's start event and publishes the wants decided and not
// recorded ([rollout.State.Pending]), checking first whether each was
// stored already (its deterministic message id), so no node gets a want
// twice for one step and none is skipped.
//
// Once its rollout is idle ([rollout.State.Idle]: final, nothing pending),
// a fleet's controller stops reading the nodes' events and follows only
// the fleet's rollout subjects; a start, a page or an operator's verb
// wakes it, and it refolds from the newest start.
package rollouts
