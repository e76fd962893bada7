package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
	"github.com/meshfold/meshfold/store"
)

const (
	benchNodes   = 10000
	benchPerNode = 100 // 1M events
)

// benchTemplate is one node's history of benchPerNode events, built with
// the fold (reconciletest.Scripted), sequences 1..benchPerNode.
func benchTemplate() *reconciletest.Stream {
	s := reconciletest.Scripted([]string{"t"}, benchPerNode, 1, nil)
	s.Events = s.Events[:benchPerNode]
	return s
}

// remap returns ev's payload with every stream sequence it names mapped
// by f: an increasing map keeps the fold's decisions (it only compares
// sequences), so node i's copy of the template is a valid history of its
// own at its own sequences.
func remap(p events.Payload, f func(uint64) uint64) events.Payload {
	switch p := p.(type) {
	case *events.Settle:
		c := *p
		c.Plan = f(c.Plan)
		return &c
	case *events.Refusal:
		c := *p
		c.Plan = f(c.Plan)
		return &c
	case *events.Filled:
		c := *p
		c.Plan = f(c.Plan)
		return &c
	case *events.Plan:
		c := *p
		c.Cause, c.Want = f(c.Cause), f(c.Want)
		return &c
	case *events.Knock:
		c := *p
		c.Cause = f(c.Cause)
		c.Owed = make([]events.Owed, len(p.Owed))
		for i, o := range p.Owed {
			o.Plan = f(o.Plan)
			c.Owed[i] = o
		}
		return &c
	case *events.Journal:
		c := *p
		c.Cause = f(c.Cause)
		return &c
	}
	return p
}

// benchStream publishes 1M events over 10,000 nodes, interleaved round
// robin (event r of every node, then event r+1), so a node's 100 events
// are spread over the whole stream as on a real mesh. It takes ~5 s here;
// b.Loop calls the benchmark function once, so it is built once a run.
func benchStream(b *testing.B) *mesh {
	start := time.Now()
	tmpl := benchTemplate()
	m := startMesh(b)
	subj := m.cfg.Subjects()
	names := make([]string, benchNodes)
	for i := range names {
		names[i] = fmt.Sprintf("n%05d", i)
	}
	publishEvents(b, m.js, benchNodes*benchPerNode, func(k int) (string, []byte, uint64) {
		r, i := k/benchNodes, k%benchNodes
		f := func(x uint64) uint64 {
			if x == 0 {
				return 0
			}
			return (x-1)*benchNodes + uint64(i) + 1
		}
		ev := tmpl.Events[r]
		var data []byte
		var err error
		if ev.Payload == nil {
			data, err = tmpl.Data(ev)
		} else {
			data, err = events.Encode(remap(ev.Payload, f))
		}
		if err != nil {
			b.Fatal(err)
		}
		return subj.Event(names[i], ev.Kind), data, uint64(k + 1)
	})
	b.Logf("fixture: %d events over %d nodes published in %v", benchNodes*benchPerNode, benchNodes, time.Since(start).Round(time.Millisecond))
	return m
}

func skipUnlessBench(b *testing.B) {
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" || testing.Short() {
		b.Skip("the 1M-event fixture is built only with -bench and without -short")
	}
}

// BenchmarkAudit1M compares, on a stream of 1M events over 10,000 nodes,
// auditing one node's full history (read and decode its events, replay
// them through the fold, render its timeline) with a raw replay of the
// same node's messages (an ordered consumer filtered to the node, messages
// counted, nothing decoded), alternating the two in every iteration. It
// reports raw-ms and audit-ms per replay and their ratio (the issue's
// bound: audit/raw ≤ 2); ns/op is the sum of both.
func BenchmarkAudit1M(b *testing.B) {
	skipUnlessBench(b)
	m := benchStream(b)
	ctx := context.Background()
	r := m.reader(b)
	node := "n05000"
	filter := m.cfg.Subjects().StoredNode(node)

	raw := func() {
		cons, err := m.js.OrderedConsumer(ctx, m.cfg.Name, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
		if err != nil {
			b.Fatal(err)
		}
		it, err := cons.Messages()
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for {
			msg, err := it.Next()
			if err != nil {
				b.Fatal(err)
			}
			n++
			if meta, _ := msg.Metadata(); meta.NumPending == 0 {
				break
			}
		}
		it.Stop()
		if n != benchPerNode {
			b.Fatalf("%d messages", n)
		}
	}
	full := func() {
		h, err := r.History(ctx, node, query.Bounds{})
		if err != nil {
			b.Fatal(err)
		}
		if len(h.Events) != benchPerNode {
			b.Fatalf("%d events", len(h.Events))
		}
		st := h.AsOf(audit.SeqBound(h.Events[len(h.Events)-1].Seq))
		if st.Events != benchPerNode {
			b.Fatal(st.Events)
		}
		entries := h.Timeline(0, len(h.Events))
		w := audit.SeqWidth(entries)
		for _, e := range entries {
			io.WriteString(io.Discard, e.Line(w))
		}
	}
	// Warm both paths once, then alternate them in every iteration and
	// time each, so both see the same caches and the same machine.
	raw()
	full()
	var rawT, auditT time.Duration
	n := 0
	for b.Loop() {
		t0 := time.Now()
		raw()
		t1 := time.Now()
		full()
		rawT += t1.Sub(t0)
		auditT += time.Since(t1)
		n++
	}
	b.ReportMetric(float64(rawT.Microseconds())/float64(n)/1000, "raw-ms")
	b.ReportMetric(float64(auditT.Microseconds())/float64(n)/1000, "audit-ms")
	b.ReportMetric(float64(auditT)/float64(rawT), "audit/raw")
}

// BenchmarkFleet10k: `meshfold fleet` without the journal read on 10,000
// node snapshots stored without summaries (as a build that wrote none
// left them): one headers-only pass, then one KV pass, decode, rows,
// sort.
func BenchmarkFleet10k(b *testing.B) {
	if testing.Short() {
		b.Skip("-short")
	}
	m := startMesh(b)
	ctx := context.Background()
	snaps, err := store.OpenSnapshots(ctx, m.js, m.cfg)
	if err != nil {
		b.Fatal(err)
	}
	tmpl := benchTemplate().State("t")
	byPart := map[int]map[string][]byte{}
	size := 0
	for i := range benchNodes {
		st := tmpl.Clone()
		st.Node = fmt.Sprintf("n%05d", i)
		data, err := json.Marshal(st)
		if err != nil {
			b.Fatal(err)
		}
		size = len(data)
		p := events.Partition(st.Node, m.cfg.Partitions)
		if byPart[p] == nil {
			byPart[p] = map[string][]byte{}
		}
		byPart[p][st.Node] = data
	}
	for p, states := range byPart {
		if err := snaps.PutNodes(ctx, p, states); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("10,000 snapshots of %d bytes", size)
	r := m.reader(b)
	now := time.Now()
	for b.Loop() {
		rows, err := r.FleetRows(ctx, now, 10*time.Minute)
		if err != nil || len(rows) != benchNodes {
			b.Fatalf("%d rows, %v", len(rows), err)
		}
		audit.SortFleet(rows)
		if err := printFleet(io.Discard, rows, time.Now(), fleetPaging{page: 1}, "", ""); err != nil {
			b.Fatal(err)
		}
	}
}
