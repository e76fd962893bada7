package enginetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
	"github.com/meshfold/meshfold/store"
)

// History is a fleet's stream exactly as the reconciler would write it:
// input events with the effects of each appended right after it, each at
// the sequence it will have on a fresh stream (Msgs[i] at sequence i+1).
type History struct {
	Msgs  []*nats.Msg
	Nodes int
}

// Node is the name of the simulated fleet's node i: "node-%05d".
func Node(i int) string { return fmt.Sprintf("node-%05d", i) }

// simAt is the time stamped on every simulated event.
var simAt = time.Date(2026, 11, 3, 20, 50, 0, 0, time.UTC)

// simDigest is the digest of every simulated filled write.
const simDigest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// simulator folds each node's events through reconciletest's stream (the
// one simulator of the fold) and appends every event and its effects, in
// order, to h.
type simulator struct {
	h      *History
	stream *reconciletest.Stream
	names  []string // Node(i)
	plans  []uint64
	// inputsOnly keeps only wants and haves in h (the fold still sees
	// every event).
	inputsOnly bool
}

func newSimulator(nodes int) *simulator {
	s := &simulator{h: &History{Nodes: nodes}, stream: reconciletest.New(simAt, 0), names: make([]string, nodes), plans: make([]uint64, nodes)}
	for i := range s.names {
		s.names[i] = Node(i)
	}
	return s
}

// fold appends p for node i and then the effects the fold gives for it,
// each effect with its id as the message id, and drops them from the
// stream (the history holds them).
func (s *simulator) fold(i int, p events.Payload) {
	node := s.names[i]
	in := s.stream.Append(node, p)
	effs := s.stream.Effects(in.Seq)
	for j, ev := range s.stream.Events {
		id := ""
		if j > 0 {
			id = effs[j-1].ID()
		}
		if ev.Kind == events.KindPlan {
			s.plans[i] = ev.Seq
		}
		if s.inputsOnly && ev.Kind != events.KindWant && ev.Kind != events.KindHave {
			continue
		}
		data, err := events.Encode(ev.Payload)
		if err != nil {
			panic(err)
		}
		m := nats.NewMsg(events.Subjects{}.Event(node, ev.Kind))
		m.Data = data
		if id != "" {
			m.Header.Set(jetstream.MsgIDHeader, id)
		}
		s.h.Msgs = append(s.h.Msgs, m)
	}
	s.stream.Trim()
}

// want is round r's want: four modules, two of them with a file, whose
// builds change every tenth round (build names "b<r/10>").
func want(build string) *events.Want {
	return &events.Want{Modules: []events.WantModule{
		{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		{Name: "postgres", Build: "pg:" + build, RunsAs: "postgres", Files: []events.File{{Path: "/etc/postgres/pw", Mode: "0600"}}},
		{Name: "restic", Build: "r:" + build, RunsAs: "restic", Files: []events.File{{Path: "/etc/restic/key", Mode: "0600"}}},
		{Name: "power", Build: "w:1", RunsAs: "power"},
	}}
}

func have(build string) *events.Have {
	return &events.Have{Modules: []events.HaveModule{
		{Name: "provisioner", Build: "p:1", State: events.Running, Account: "prov"},
		{Name: "postgres", Build: "pg:" + build, State: events.Running, Account: "postgres"},
		{Name: "restic", Build: "r:" + build, State: events.Running, Account: "restic"},
		{Name: "power", Build: "w:1", State: events.Running, Account: "power"},
	}}
}

// Simulate builds a history of about n events (inputs and effects) over
// nodes nodes: per node and round, a want every tenth round, a settle of
// the latest plan, two haves, a refusal and two filled writes. Each
// node's newest plan is settled.
func Simulate(n, nodes int) *History { return simulate(newSimulator(nodes), n) }

// SimulateInputs is the wants and haves of a [Simulate] history long
// enough to hold about n of them: a stream of n inputs whose effects were
// never stored, for a first refold that must publish its plans (without
// building the three times longer whole history first).
func SimulateInputs(n, nodes int) *History {
	s := newSimulator(nodes)
	s.inputsOnly = true
	return simulate(s, n)
}

func simulate(s *simulator, n int) *History {
	nodes := len(s.plans)
	for r := 0; len(s.h.Msgs) < n; r++ {
		build := fmt.Sprintf("b%d", r/10)
		for i := range nodes {
			if r%10 == 0 {
				s.fold(i, want(build))
			}
			s.fold(i, &events.Settle{Module: "postgres", Op: events.OpApply, Plan: s.plans[i]})
			s.fold(i, have(build))
			s.fold(i, &events.Refusal{Module: "restic", Path: "/etc/restic/new", Reason: events.ReasonUndeclared, Plan: s.plans[i], Writer: "prov"})
			s.fold(i, &events.Filled{Module: "postgres", Path: "/etc/postgres/pw", Plan: s.plans[i], Digest: simDigest})
			s.fold(i, &events.Filled{Module: "restic", Path: "/etc/restic/key", Plan: s.plans[i], Digest: simDigest})
			s.fold(i, have(build))
		}
	}
	return s.h
}

// SimulateDense builds the effect-dense mix of issue 27: about n events
// (inputs and effects) over nodes nodes, each node's inputs in rounds of
// ten: a want of a new build, then nine haves. Every want causes a plan,
// and the wants name no account for the provisioner module while most
// haves report it running as "prov", so the fold journals the missing
// account (a warning) after the want and again each time a have reports
// the provisioner back after one that did not: about a quarter of the
// inputs cause an effect. Its inputs are wants and haves only, so a
// stream of them alone ([History.Inputs]) causes the same effects on a
// first refold.
func SimulateDense(n, nodes int) *History { return simulateDense(newSimulator(nodes), n) }

// SimulateDenseInputs is the wants and haves of a [SimulateDense]
// history holding about n of them (see [SimulateInputs]).
func SimulateDenseInputs(n, nodes int) *History {
	s := newSimulator(nodes)
	s.inputsOnly = true
	return simulateDense(s, n)
}

// denseHaves is which of a dense round's nine haves report the
// provisioner running (true) or not listed (false).
var denseHaves = [9]bool{true, true, false, true, true, true, false, true, true}

func simulateDense(s *simulator, n int) *History {
	nodes := len(s.plans)
	for r := 0; len(s.h.Msgs) < n; r++ {
		build := fmt.Sprintf("b%d", r)
		for i := range nodes {
			w := want(build)
			w.Modules[0].RunsAs = ""
			s.fold(i, w)
			for _, prov := range denseHaves {
				h := have(build)
				if !prov {
					h.Modules = h.Modules[1:]
				}
				s.fold(i, h)
			}
		}
	}
	return s.h
}

// SimulateDown builds the history of nodes nodes that are down while
// wants keep coming: each node reports one have and settles its first
// plan, then receives wants more wants, each of a new build, and never
// settles or reports again. Every plan after the first stays unsettled.
func SimulateDown(nodes, wants int) *History {
	s := newSimulator(nodes)
	for i := range nodes {
		s.fold(i, want("b0"))
		s.fold(i, have("b0"))
		s.fold(i, &events.Settle{Module: "postgres", Op: events.OpApply, Plan: s.plans[i]})
	}
	for w := 1; w <= wants; w++ {
		build := fmt.Sprintf("b%d", w)
		for i := range nodes {
			s.fold(i, want(build))
		}
	}
	return s.h
}

// Kinds is the history's messages of the given kinds only, in order (a
// history of inputs only is not at the sequences of a fresh stream's
// reconciler writes: the reconciler publishes its effects between them).
func (h *History) Kinds(kinds ...events.Kind) *History {
	out := &History{Nodes: h.Nodes}
	for _, m := range h.Msgs {
		_, kind, _ := events.Subjects{}.Parse(m.Subject)
		for _, k := range kinds {
			if kind == k {
				out.Msgs = append(out.Msgs, m)
				break
			}
		}
	}
	return out
}

// Inputs is the history's wants and haves only: what a first refold that
// must publish its plans reads.
func (h *History) Inputs() *History { return h.Kinds(events.KindWant, events.KindHave) }

// InputCount is the count of the history's messages the fold reads (every
// kind but knocks and journal entries).
func (h *History) InputCount() int {
	n := 0
	for _, m := range h.Msgs {
		if _, kind, _ := (events.Subjects{}).Parse(m.Subject); kind != events.KindKnock && kind != events.KindJournal {
			n++
		}
	}
	return n
}

// Load publishes the history on js's stream, in order (at most 2,000
// acks pending), and returns the stream's last sequence. It fails tb on
// any publish error.
func (h *History) Load(tb testing.TB, js jetstream.JetStream) uint64 {
	tb.Helper()
	last, err := h.Publish(js)
	if err != nil {
		tb.Fatal(err)
	}
	return last
}

// Publish is [History.Load] that returns the first publish error instead
// of failing a test, for a goroutine the test starts (which must not call
// tb.Fatal).
func (h *History) Publish(js jetstream.JetStream) (uint64, error) {
	var last uint64
	const window = 2000
	futs := make([]jetstream.PubAckFuture, 0, window)
	flush := func() error {
		defer func() { futs = futs[:0] }()
		for _, f := range futs {
			select {
			case a := <-f.Ok():
				last = max(last, a.Sequence)
			case err := <-f.Err():
				return err
			}
		}
		return nil
	}
	for _, m := range h.Msgs {
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			return last, err
		}
		futs = append(futs, f)
		if len(futs) == window {
			if err := flush(); err != nil {
				return last, err
			}
		}
	}
	return last, flush()
}

// Seal returns the history as a reconciler holding effect-id key key and
// signer s writes it: each effect's Nats-Msg-Id made with
// store.EffectMsgID (so a reconciler reading it with the same key
// recognises the effect as stored) and each plan and knock signed by s
// (nil: unsigned, as a reconciler without a signer writes them). The
// inputs are shared with h; the effects are copies. Without it, a
// reconciler sees the simulated effects' plain ids as another
// publisher's and publishes its last effects again.
func (h *History) Seal(key []byte, s *store.Signer) *History {
	out := &History{Nodes: h.Nodes, Msgs: make([]*nats.Msg, len(h.Msgs))}
	for i, m := range h.Msgs {
		id := m.Header.Get(jetstream.MsgIDHeader)
		if id == "" {
			out.Msgs[i] = m
			continue
		}
		node, kind, err := events.Subjects{}.Parse(m.Subject)
		if err != nil {
			panic(err)
		}
		c := nats.NewMsg(m.Subject)
		c.Data = m.Data
		msgID := store.EffectMsgID(key, id)
		c.Header.Set(jetstream.MsgIDHeader, msgID)
		if s != nil && (kind == events.KindPlan || kind == events.KindKnock) {
			if err := s.Sign(c.Header, node, kind, msgID, c.Data); err != nil {
				panic(err)
			}
		}
		out.Msgs[i] = c
	}
	return out
}

// Effects folds h's messages, as a reconciler reading h alone folds
// them, through a fresh reconciletest stream and returns the data of
// each effect the fold gives, in order: what a first refold of a stream
// holding h publishes (its plans folded back as it folds its own).
func (h *History) Effects() [][]byte {
	msgs := h.EffectMsgs()
	out := make([][]byte, len(msgs))
	for i, m := range msgs {
		out[i] = m.Data
	}
	return out
}

// EffectMsgs is [History.Effects] as messages on each effect's plain
// subject (<prefix>.<node>.<kind>, the default prefix), without headers.
func (h *History) EffectMsgs() []*nats.Msg {
	st := reconciletest.New(simAt, 0)
	var out []*nats.Msg
	for _, m := range h.Msgs {
		node, kind, err := events.Subjects{}.Parse(m.Subject)
		if err != nil {
			panic(err)
		}
		in := st.AppendRaw(node, kind, m.Data)
		for _, e := range st.Effects(in.Seq) {
			data, err := events.Encode(e.Payload)
			if err != nil {
				panic(err)
			}
			out = append(out, &nats.Msg{Subject: events.Subjects{}.Event(e.Node, e.Kind), Data: data})
		}
		st.Trim()
	}
	return out
}
