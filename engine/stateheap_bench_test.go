package engine

import (
	"runtime"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/engine/enginetest"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// BenchmarkStateHeap reports the heap a settled node's state takes at the
// bench's mix (an [enginetest.Simulate] history, 20 events a node, 10,000
// nodes, 16 partitions): its objects and bytes, from runtime.MemStats
// after a collection before and after the states are made. fold: each
// message folded as session.fold does (decoded through its partition's
// interner, its strings and lists interned, a new plan's rows shared);
// snapshot: the states of that fold encoded as a checkpoint writes them,
// then decoded and interned as a load reads them (the snapshots' bytes are
// made before the first reading and kept past the second, so not
// counted). objects/node and B/node are everything the load keeps (the
// states, the partitions' maps, the interners); state-objects/node and
// state-B/node what dropping the states alone frees (issue 27, the
// collector's marking of the states).
//
//	go test ./engine -run '^$' -bench StateHeap -benchtime 1x
func BenchmarkStateHeap(b *testing.B) {
	const nodes, parts = 10_000, 16
	h := enginetest.Simulate(20*nodes, nodes)
	type part struct {
		in     *interner
		states map[string]*reconcile.State
	}
	newParts := func() []*part {
		ps := make([]*part, parts)
		for i := range ps {
			ps[i] = &part{in: newInterner(), states: map[string]*reconcile.State{}}
		}
		return ps
	}
	fold := func() []*part {
		ps := newParts()
		subj := events.Subjects{}
		for i, m := range h.Msgs {
			// A subject of its own, as the client hands it over: the
			// state's node name is part of its first message's.
			node, kind, err := subj.Parse(strings.Clone(m.Subject))
			if err != nil || !kind.Input() {
				continue
			}
			p := ps[events.Partition(node, parts)]
			ev := events.Event{Seq: uint64(i + 1), Node: node, Kind: kind}
			ev.Payload, ev.Err = p.in.dec.Decode(kind, m.Data)
			if ev.Payload != nil {
				p.in.read(ev.Payload)
			}
			st := p.states[node]
			if st == nil {
				st = reconcile.NewState(node)
				p.states[node] = st
			}
			p.in.folded(st, st.Fold(ev))
		}
		return ps
	}
	var snaps [][]byte
	for _, p := range fold() {
		for _, st := range p.states {
			data, err := reconcile.MarshalState(st)
			if err != nil {
				b.Fatal(err)
			}
			snaps = append(snaps, data)
		}
	}
	load := func() []*part {
		ps := newParts()
		for _, data := range snaps {
			st, err := reconcile.UnmarshalState(data)
			if err != nil {
				b.Fatal(err)
			}
			p := ps[events.Partition(st.Node, parts)]
			p.in.state(st)
			p.states[st.Node] = st
		}
		return ps
	}
	for _, c := range []struct {
		name string
		make func() []*part
	}{{"fold", fold}, {"snapshot", load}} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				var m0, m1, m2 runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&m0)
				ps := c.make()
				runtime.GC()
				runtime.ReadMemStats(&m1)
				for _, p := range ps {
					if len(p.states) == 0 {
						b.Fatal("a partition holds no state")
					}
					p.states = nil
				}
				runtime.GC()
				runtime.ReadMemStats(&m2)
				runtime.KeepAlive(ps)
				per := func(x, y uint64) float64 { return float64(int64(x)-int64(y)) / nodes }
				b.ReportMetric(per(m1.HeapObjects, m0.HeapObjects), "objects/node")
				b.ReportMetric(per(m1.HeapAlloc, m0.HeapAlloc), "B/node")
				b.ReportMetric(per(m1.HeapObjects, m2.HeapObjects), "state-objects/node")
				b.ReportMetric(per(m1.HeapAlloc, m2.HeapAlloc), "state-B/node")
			}
		})
	}
	runtime.KeepAlive(snaps)
}
