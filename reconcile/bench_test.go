package reconcile_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
)

type rawMsg struct {
	subject string
	data    []byte
	seq     uint64
	t       time.Time
}

// fleetStream records a realistic mixed stream for nodes nodes: each node
// gets a want of five modules (one the provisioner, three with files), its
// plan, settles, haves, refusals, filled writes and an approval, in the
// proportions of a running fleet (haves and fills dominate; wants are
// rare). It returns the messages as the reconciler reads them.
func fleetStream(tb tb, nodes, rounds int) []rawMsg {
	subj := events.Subjects{}
	stream := reconciletest.New(base, time.Second)
	names := make([]string, nodes)
	for i := range names {
		names[i] = fmt.Sprintf("node-%d", i)
	}
	for r := range rounds {
		build := fmt.Sprintf("b%d", r/10)
		w := &events.Want{Modules: []events.WantModule{
			{Name: "provisioner", Build: "p:" + build, RunsAs: "prov", Provisioner: true},
			{Name: "postgres", Build: "pg:" + build, RunsAs: "postgres", Files: []events.File{{Path: "/etc/postgres/pw", Mode: "0600"}}},
			{Name: "restic", Build: "r:" + build, RunsAs: "restic", Files: []events.File{{Path: "/etc/restic/key", Mode: "0600"}, {Path: "/etc/restic/env", Mode: "0640"}}},
			{Name: "nats", Build: "n:" + build, RunsAs: "nats", RequiresApproval: true, Files: []events.File{{Path: "/etc/nats/nats.creds", Mode: "0600"}}},
			{Name: "power", Build: "w:1", RunsAs: "power"},
		}}
		have := func() *events.Have {
			return &events.Have{Modules: []events.HaveModule{
				{Name: "provisioner", Build: "p:" + build, State: events.Running, Account: "prov"},
				{Name: "postgres", Build: "pg:" + build, State: events.Running, Account: "postgres"},
				{Name: "restic", Build: "r:" + build, State: events.Running, Account: "restic"},
				{Name: "nats", Build: "n:b0", State: events.Running, Account: "nats"},
				{Name: "power", Build: "w:1", State: events.Running, Account: "power"},
			}}
		}
		digest := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
		for _, node := range names {
			add := func(p events.Payload) { stream.Append(node, p) }
			if r%10 == 0 {
				add(&events.Want{Modules: w.Modules})
				add(&events.Approve{Module: "nats", Build: "n:" + build, By: "ops"})
			}
			plans := stream.Plans(node)
			plan := plans[len(plans)-1]
			add(&events.Settle{Module: "postgres", Op: events.OpApply, Plan: plan})
			add(have())
			add(&events.Refusal{Module: "restic", Path: "/etc/restic/new", Reason: events.ReasonUndeclared, Plan: plan, Writer: "prov"})
			add(&events.Filled{Module: "postgres", Path: "/etc/postgres/pw", Plan: plan, Digest: digest})
			add(&events.Filled{Module: "restic", Path: "/etc/restic/key", Plan: plan, Digest: digest})
			add(have())
		}
	}
	var out []rawMsg
	for _, ev := range stream.Events {
		if ev.Kind == events.KindKnock || ev.Kind == events.KindJournal {
			continue // not inputs of the fold: the workload is the inputs and plans
		}
		data, err := events.Encode(ev.Payload)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, rawMsg{subject: subj.Event(ev.Node, ev.Kind), data: data, seq: ev.Seq, t: ev.Time})
	}
	return out
}

// BenchmarkFold decodes and folds a realistic mixed stream; one op is one
// event. The fold must never be the bottleneck beside JetStream, which
// consumes about 200k events/s here (5 µs each): target ≤ 2 µs/event.
func BenchmarkFold(b *testing.B) {
	msgs := fleetStream(b, 100, 40)
	subj := events.Subjects{}
	states := map[string]*reconcile.State{}
	b.ReportAllocs()
	b.ResetTimer()
	effects := 0
	for i := 0; i < b.N; i++ {
		m := msgs[i%len(msgs)]
		if i%len(msgs) == 0 {
			clear(states)
		}
		ev, err := subj.DecodeEvent(m.subject, m.data, m.seq, m.t)
		if err != nil {
			b.Fatal(err)
		}
		st := states[ev.Node]
		if st == nil {
			st = reconcile.NewState(ev.Node)
			states[ev.Node] = st
		}
		effects += len(st.Fold(ev))
	}
	b.ReportMetric(float64(effects)/float64(b.N), "effects/event")
}

// BenchmarkDecode is BenchmarkFold's decoding alone, to tell the two
// costs apart.
func BenchmarkDecode(b *testing.B) {
	msgs := fleetStream(b, 100, 40)
	subj := events.Subjects{}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m := msgs[i%len(msgs)]
		if _, err := subj.DecodeEvent(m.subject, m.data, m.seq, m.t); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStateMemory folds a realistic history for 10,000 nodes and
// reports the heap their states hold, per node (the reconciler's target:
// at most 4 KiB a node).
func BenchmarkStateMemory(b *testing.B) {
	msgs := fleetStream(b, 10_000, 12)
	subj := events.Subjects{}
	for range b.N {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		states := map[string]*reconcile.State{}
		for _, m := range msgs {
			ev, err := subj.DecodeEvent(m.subject, m.data, m.seq, m.t)
			if err != nil {
				b.Fatal(err)
			}
			st := states[ev.Node]
			if st == nil {
				st = reconcile.NewState(ev.Node)
				states[ev.Node] = st
			}
			st.Fold(ev)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(len(states)), "B/node")
		runtime.KeepAlive(states)
	}
}

// BenchmarkSnapshotWrite is what a checkpoint encodes per dirty node: the
// state (MarshalState) and, beside it since issue 27, its fleet summary
// (MarshalSummary), over the 1,000 states of the bench's mix
// (reconciletest.Scripted, 20 inputs a node). Each reports ns and bytes
// per node.
func BenchmarkSnapshotWrite(b *testing.B) {
	names := make([]string, 1000)
	for i := range names {
		names[i] = fmt.Sprintf("t%04d", i)
	}
	s := reconciletest.Scripted(names, 20*len(names), 17, nil)
	states := make([]*reconcile.State, len(names))
	for i, n := range names {
		states[i] = s.State(n)
	}
	for _, c := range []struct {
		name string
		enc  func(*reconcile.State) ([]byte, error)
	}{{"state", reconcile.MarshalState}, {"summary", reconcile.MarshalSummary}, {"summary-format1-json", reconcile.MarshalSummaryJSON}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			size, i := 0, 0
			for b.Loop() {
				data, err := c.enc(states[i%len(states)])
				if err != nil {
					b.Fatal(err)
				}
				size += len(data)
				i++
			}
			b.ReportMetric(float64(size)/float64(i), "B/node")
		})
	}
}

// BenchmarkSummaryRead is what `meshfold fleet` decodes per node: the
// fleet summary (UnmarshalSummary) of this build's format and of format 1
// (JSON, as builds before format 2 wrote it), over the 1,000 states of
// the bench's mix. Each reports ns, allocations and bytes per node.
func BenchmarkSummaryRead(b *testing.B) {
	names := make([]string, 1000)
	for i := range names {
		names[i] = fmt.Sprintf("t%04d", i)
	}
	s := reconciletest.Scripted(names, 20*len(names), 17, nil)
	for _, c := range []struct {
		name string
		enc  func(*reconcile.State) ([]byte, error)
	}{{"format2", reconcile.MarshalSummary}, {"format1-json", reconcile.MarshalSummaryJSON}} {
		sums := make([][]byte, len(names))
		size := 0
		for i, n := range names {
			var err error
			if sums[i], err = c.enc(s.State(n)); err != nil {
				b.Fatal(err)
			}
			size += len(sums[i])
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, err := reconcile.UnmarshalSummary(sums[i%len(sums)]); err != nil {
					b.Fatal(err)
				}
				i++
			}
			b.ReportMetric(float64(size)/float64(len(sums)), "B/node")
		})
	}
}
