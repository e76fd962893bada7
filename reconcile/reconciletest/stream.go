package reconciletest

import (
	"fmt"
	"slices"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// Stream is a simulated event stream of one or more nodes: the one
// simulator of the fold that every test of the core and of the shell
// uses. Events[i] has sequence Trimmed+i+1; event N's stream time is
// Base + N×Step.
//
// After each event, Live (when set) is called with the event and the
// state of its node as the fold left it: the "live" state a reconciler
// would hold at that sequence.
type Stream struct {
	Base   time.Time
	Step   time.Duration
	Events []events.Event
	// Trimmed is the count of events [Stream.Trim] dropped from the front
	// of Events.
	Trimmed uint64
	// Live, when set, sees every event and its node's state after it.
	Live func(ev events.Event, st *reconcile.State)
	// NewState, when set, makes a node's state on its first event (a
	// test's unbounded state, say); else [reconcile.NewState].
	NewState func(node string) *reconcile.State
	// PlansOnly, when set, folds only the plans among the effects: the
	// knocks and journals are appended but not folded (folding them
	// changes nothing but the state's Seq), as the scripts of package
	// reconcile print their states.
	PlansOnly bool
	// HoldPlans, when set, keeps the plan effects the fold returns out of
	// the stream until [Stream.Release] appends them, in order: a
	// reconciler that reads its plans back only after later events of
	// their node (wants published while it was down, refolded at its
	// restart before any of their plans is published).
	HoldPlans bool

	held    []events.Event
	raw     map[uint64][]byte
	states  map[string]*reconcile.State
	effects map[uint64][]reconcile.Effect
	plans   map[string][]uint64
}

// New returns an empty stream whose event N happens at base + N×step.
func New(base time.Time, step time.Duration) *Stream {
	return &Stream{Base: base, Step: step, raw: map[uint64][]byte{}, states: map[string]*reconcile.State{},
		effects: map[uint64][]reconcile.Effect{}, plans: map[string][]uint64{}}
}

// Next returns the sequence the next appended event gets.
func (s *Stream) Next() uint64 { return s.Trimmed + uint64(len(s.Events)) + 1 }

// Event returns the event at seq, and false when there is none (or Trim
// dropped it).
func (s *Stream) Event(seq uint64) (events.Event, bool) {
	if seq <= s.Trimmed || seq >= s.Next() {
		return events.Event{}, false
	}
	return s.Events[seq-s.Trimmed-1], true
}

// Effects returns the effects the fold returned for the event at seq, in
// order, as the reconciler publishes them: they are the events right after
// it. Nil for an event that made none, for an effect, and for an event
// Trim dropped.
func (s *Stream) Effects(seq uint64) []reconcile.Effect { return s.effects[seq] }

// Plans returns the sequences of the plans the fold emitted for node,
// oldest first (Trim keeps them).
func (s *Stream) Plans(node string) []uint64 { return s.plans[node] }

// Trim drops the events and effects held so far (a long history's memory)
// and keeps the states, the plans' sequences and the numbering.
func (s *Stream) Trim() {
	s.Trimmed += uint64(len(s.Events))
	s.Events = s.Events[:0]
	clear(s.raw)
	clear(s.effects)
}

// TimeOf returns the stream time of sequence seq.
func (s *Stream) TimeOf(seq uint64) time.Time { return s.Base.Add(time.Duration(seq) * s.Step) }

// State returns node's live state (created empty on first use). Callers
// must not change it.
func (s *Stream) State(node string) *reconcile.State {
	st, ok := s.states[node]
	if !ok {
		if s.NewState != nil {
			st = s.NewState(node)
		} else {
			st = reconcile.NewState(node)
		}
		s.states[node] = st
	}
	return st
}

// Append stamps p with the time of its sequence, appends it as node's
// event, folds it, and appends the effects the fold returns (folding each
// plan effect as it lands). It returns the appended input event.
func (s *Stream) Append(node string, p events.Payload) events.Event {
	seq := s.Next()
	events.Stamp(p, s.TimeOf(seq))
	return s.add(events.Event{Seq: seq, Time: s.TimeOf(seq), Node: node, Kind: p.Kind(), Payload: p})
}

// AppendRaw appends data as node's event of kind k exactly as given,
// decoded as a reader of the stream decodes it (it may carry Err), and
// folds it like [Stream.Append].
func (s *Stream) AppendRaw(node string, k events.Kind, data []byte) events.Event {
	seq := s.Next()
	p, err := events.Decode(k, data)
	s.raw[seq] = append([]byte(nil), data...)
	return s.add(events.Event{Seq: seq, Time: s.TimeOf(seq), Node: node, Kind: k, Payload: p, Err: err})
}

// AppendEvent appends ev as its node's event at the next sequence and
// its time, exactly as given otherwise (a plan whose signature did not
// verify, with Foreign set, say), and folds it like [Stream.Append].
func (s *Stream) AppendEvent(ev events.Event) events.Event {
	ev.Seq = s.Next()
	ev.Time = s.TimeOf(ev.Seq)
	return s.add(ev)
}

func (s *Stream) add(ev events.Event) events.Event {
	s.Events = append(s.Events, ev)
	st := s.State(ev.Node)
	effs := st.Fold(ev)
	if len(effs) > 0 {
		s.effects[ev.Seq] = effs
	}
	if s.Live != nil {
		s.Live(ev, st)
	}
	for _, e := range effs {
		if s.HoldPlans && e.Kind == events.KindPlan {
			s.held = append(s.held, events.Event{Node: e.Node, Kind: e.Kind, Payload: e.Payload})
			continue
		}
		seq := s.Next()
		eff := events.Event{Seq: seq, Time: s.TimeOf(seq), Node: e.Node, Kind: e.Kind, Payload: e.Payload}
		s.Events = append(s.Events, eff)
		if e.Kind == events.KindPlan {
			s.plans[e.Node] = append(s.plans[e.Node], seq)
		}
		// The reconciler folds every event of its node, its own effects
		// included (knocks and journals only advance the sequence).
		if s.PlansOnly && e.Kind != events.KindPlan {
			continue
		}
		for _, e2 := range st.Fold(eff) {
			panic(fmt.Sprintf("reconciletest: folding effect %s at #%d produced effect %s", e.ID(), seq, e2.ID()))
		}
		if s.Live != nil {
			s.Live(eff, st)
		}
	}
	return ev
}

// Held returns how many plan effects HoldPlans keeps out of the stream.
func (s *Stream) Held() int { return len(s.held) }

// Release appends the first n plan effects HoldPlans kept (all of them
// when n is larger), in the order the fold returned them, each folded as
// it lands like an appended event, and returns them.
func (s *Stream) Release(n int) []events.Event {
	n = min(n, len(s.held))
	out := make([]events.Event, 0, n)
	for _, ev := range s.held[:n] {
		ev.Seq = s.Next()
		ev.Time = s.TimeOf(ev.Seq)
		s.plans[ev.Node] = append(s.plans[ev.Node], ev.Seq)
		out = append(out, s.add(ev))
	}
	s.held = slices.Delete(s.held, 0, n)
	return out
}

// Data returns the bytes to publish for ev: the raw bytes of an event
// appended with [Stream.AppendRaw], else its encoded payload.
func (s *Stream) Data(ev events.Event) ([]byte, error) {
	if b, ok := s.raw[ev.Seq]; ok {
		return b, nil
	}
	if ev.Payload == nil {
		return nil, fmt.Errorf("reconciletest: event #%d has no payload", ev.Seq)
	}
	return events.Encode(ev.Payload)
}

// Node returns node's events, in stream order.
func (s *Stream) Node(node string) []events.Event {
	var out []events.Event
	for _, ev := range s.Events {
		if ev.Node == node {
			out = append(out, ev)
		}
	}
	return out
}

// Nodes returns the nodes that have events, in order of first appearance.
func (s *Stream) Nodes() []string {
	seen := map[string]bool{}
	var out []string
	for _, ev := range s.Events {
		if !seen[ev.Node] {
			seen[ev.Node] = true
			out = append(out, ev.Node)
		}
	}
	return out
}
