package rollout

import (
	"fmt"
	"time"

	"github.com/meshfold/meshfold/events"
)

// Input is one event the fold reads: one of the fleet's rollout events or
// one of its nodes' events, with its place in the one order the
// controller reads them in.
//
// Payload is, by Kind: *Start, *Nodes, *Published, *Refused, *Operator
// (promote, pause, resume, abort, revert), *Tick or *Record for the
// rollout's events; nil for a want (its sequence is what counts),
// *events.Plan, *events.Settle, *Have, *events.Pause (node-pause),
// *events.Retire (node-retire), *events.Filled (filled), or
// nil for down, up, node-resume, prov-down and prov-up, for a node's.
type Input struct {
	// Seq is the event's stream sequence: strictly increasing across
	// every input of the fleet (see the package doc on order).
	Seq uint64
	// Time is the stream's time of the event: the fold's only clock.
	Time time.Time
	// Node is the node of a node event; empty for a rollout event.
	Node    string
	Kind    Kind
	Payload any
	// Err is set, and Payload nil, when a rollout event could not be
	// decoded or validated: the fold records it as rejected.
	Err error
	// ID is a want's message id (KindWant; the caller reads it from the
	// message's Nats-Msg-Id): a rollout step's names the fleet, the
	// rollout and the step ([ParseWantID]), so a want of a rollout's own
	// is never taken for one changed by hand. Empty for any other input.
	ID string
	// Unverified, set on a plan (KindPlan), says that the controller
	// could not verify the plan's signature against its own keys, and
	// why (the check's error, naming the signer's key): such a plan is
	// held aside and pauses a rollout in progress, never moves it (see
	// [State.Fold]; docs/architecture.md "A rollout in progress when the
	// key changes"). Empty for a plan that verified, or when the caller
	// verifies nothing.
	Unverified string
	// Checked marks an operator's verb or node event whose `by` the
	// server checked: it came on a named operator's subject naming the
	// payload's by ([FromNamedRolloutEvent], events.Event.Checked). The
	// marks the fold makes of it say so ([Mark.Checked]).
	Checked bool
}

// Health is a have module's health (DESIGN.md §11): empty when the
// module declares no check.
type Health = events.Health

// Health values, events' own.
const (
	Starting  = events.HealthStarting
	Healthy   = events.Healthy
	Unhealthy = events.Unhealthy
)

// HaveModule is what the fold reads of one module of a have.
type HaveModule struct {
	Name  string          `json:"name"`
	Build string          `json:"build"`
	State events.RunState `json:"state"`
	// Health is empty when the module declares no check.
	Health Health `json:"health,omitempty"`
	// Restarts counts restarts since the module's last apply.
	Restarts int    `json:"restarts,omitempty"`
	Exit     string `json:"exit,omitempty"`
}

// Have is what the fold reads of a have: its modules.
type Have struct {
	Modules []HaveModule `json:"modules"`
}

// HaveOf reads a have for the fold: each module's name, build, state,
// health (DESIGN.md §11), restarts and last exit.
func HaveOf(h *events.Have) *Have {
	out := &Have{Modules: make([]HaveModule, len(h.Modules))}
	for i, m := range h.Modules {
		out.Modules[i] = HaveModule{Name: m.Name, Build: m.Build, State: m.State, Health: m.Health, Restarts: m.Restarts, Exit: m.Exit}
	}
	return out
}

// FromNodeEvent returns the input of a node event the fold reads (a want,
// plan, settle, have, pause, resume, retire, filled or provisioner
// down or up that decoded), and false for any other: the
// reconciler journals what does not decode, and the rollout has nothing
// to learn from it. The agent's down and up moments are built by the
// controller as Input{Kind: KindDown or KindUp} from wherever liveness
// records them.
func FromNodeEvent(ev events.Event) (Input, bool) {
	in := Input{Seq: ev.Seq, Time: ev.Time, Node: ev.Node, Checked: ev.Checked}
	if ev.Err != nil || ev.Payload == nil || ev.Foreign {
		return in, false
	}
	switch p := ev.Payload.(type) {
	case *events.Want:
		in.Kind = KindWant
	case *events.Plan:
		in.Kind, in.Payload = KindPlan, p
	case *events.Settle:
		in.Kind, in.Payload = KindSettle, p
	case *events.Have:
		in.Kind, in.Payload = KindHave, HaveOf(p)
	case *events.Pause:
		in.Kind, in.Payload = KindNodePause, p
	case *events.Resume:
		in.Kind = KindNodeResume
	case *events.Retire:
		in.Kind, in.Payload = KindNodeRetire, p
	case *events.Filled:
		in.Kind, in.Payload = KindFilled, p
	case *events.Prov:
		in.Kind = KindProvUp
		if p.State == events.AgentDown {
			in.Kind = KindProvDown
		}
	default:
		return in, false
	}
	return in, true
}

// FromRolloutEvent returns the input of a rollout event of kind k stored
// at seq and time t, decoded and validated ([Decode]); a payload that
// does not decode gives an input with Err set, which the fold records as
// rejected.
func FromRolloutEvent(k Kind, data []byte, seq uint64, t time.Time) Input {
	in := Input{Seq: seq, Time: t, Kind: k}
	in.Payload, in.Err = Decode(k, data)
	return in
}

// FromNamedRolloutEvent is [FromRolloutEvent] of an event stored on a
// named operator's rollout subject (events.Subjects.NamedRollout): by is
// the name the subject gives, which the server checked against the
// publisher's credentials. Only an operator's verb ([Operator]) whose
// payload names by is taken; any other payload on such a subject gives
// an input with Err wrapping events.ErrNotPublisher, which the fold
// records as rejected and never acts on: alice's creds cannot pause a
// rollout as bob. An empty by is [FromRolloutEvent].
func FromNamedRolloutEvent(k Kind, data []byte, seq uint64, t time.Time, by string) Input {
	in := FromRolloutEvent(k, data, seq, t)
	if by == "" || in.Err != nil {
		return in
	}
	got := ""
	if op, ok := in.Payload.(*Operator); ok {
		if op.By == by {
			in.Checked = true
			return in
		}
		got = op.By
	}
	in.Payload, in.Err = nil, &events.FieldError{Field: "by", Value: got, Err: fmt.Errorf("%w (%s)", events.ErrNotPublisher, by)}
	return in
}
