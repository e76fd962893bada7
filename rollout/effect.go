package rollout

import (
	"strconv"
	"strings"

	"github.com/meshfold/meshfold/events"
)

// Effect is one thing the controller must do: publish a want on a node's
// want subject, or append a record on the fleet's rollout subject.
// Exactly one of Want and Record is set.
type Effect struct {
	Fleet string
	// Cause is the stream sequence of the event whose folding produced it.
	Cause uint64
	// N counts the records produced by the same cause: 0, 1, …
	N      int
	Want   *WantEffect
	Record *Record
}

// WantEffect is a want to publish: a target's new want (step forward) or
// its previous one given back (step revert).
type WantEffect struct {
	Rollout uint64
	Node    string
	Step    Step
	// Modules are the want's modules. For a revert they are nil when
	// CopyOf names the previous want: the controller publishes the modules
	// of the want stored at that sequence (it reads the message by
	// sequence); a revert of a target whose previous want the start
	// carries (every target's, within its bound; [NodeAtStart].Had)
	// carries that want; a revert of a node that had no want before
	// carries an empty, non-nil list (every module removed).
	Modules []events.WantModule
	CopyOf  uint64
	// Expect is the sequence of the node's newest want the step was
	// decided against: publish with Nats-Expected-Last-Subject-Sequence
	// set to it (0: the subject must hold no message), so a want changed
	// by hand meanwhile is refused, never overwritten (DESIGN.md §11).
	Expect uint64
	// Why says why the step gives the target this want, one line: its
	// batch, who applied the rollout and why, who promoted the canary;
	// for a revert, who reverted and why. The controller publishes it in
	// the want's [HeaderWhy], so the node's timeline marks the step.
	Why string
}

// HeaderWhy is the header of a rollout step's want that carries
// [WantEffect.Why]; the want's message id ([WantID]) names the fleet,
// the rollout and the step.
const HeaderWhy = "Meshfold-Rollout-Why"

// ParseWantID reads a step's want message id ([WantID]): ok is false for
// any other id (a want published by hand has none, or its own).
func ParseWantID(id string) (fleet string, rollout uint64, node string, step Step, ok bool) {
	parts := strings.Split(id, ".")
	if len(parts) != 5 || parts[1] != "rollout" || !events.ValidName(parts[0]) || !events.ValidName(parts[3]) {
		return "", 0, "", "", false
	}
	n, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil || n == 0 {
		return "", 0, "", "", false
	}
	switch Step(parts[4]) {
	case StepForward, StepRevert, StepOver:
		return parts[0], n, parts[3], Step(parts[4]), true
	}
	return "", 0, "", "", false
}

// ID is the effect's message id. A want's is
// `<fleet>.rollout.<rollout>.<node>.<step>`: one forward want (and, at
// most once, its [StepOver] again) and one revert per target and rollout, whatever event caused it, so a replay, a
// restart or a second controller makes the same id. A record's is
// `<fleet>.record.<cause>.<n>`.
func (e Effect) ID() string {
	if e.Want != nil {
		return WantID(e.Fleet, e.Want.Rollout, e.Want.Node, e.Want.Step)
	}
	return e.Fleet + ".record." + strconv.FormatUint(e.Cause, 10) + "." + strconv.Itoa(e.N)
}

// WantID is the message id of a step's want.
func WantID(fleet string, rollout uint64, node string, step Step) string {
	return fleet + ".rollout." + strconv.FormatUint(rollout, 10) + "." + node + "." + string(step)
}

// OutcomeID is the message id of the controller's record of a step's
// outcome, [Published] or [Refused]: one per step, so the first one stored
// is the outcome.
func OutcomeID(fleet string, rollout uint64, node string, step Step) string {
	return fleet + ".outcome." + strconv.FormatUint(rollout, 10) + "." + node + "." + string(step)
}
