package engine_test

import (
	"context"
	"fmt"
	"runtime/trace"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// knockLoad is the rate of other nodes' haves published while
// BenchmarkKnockLatency measures (issue 17 asks for 50,000/s; the rate
// reached is reported, and on this 2-core machine the publisher, the
// server and the reconciler share the cores).
const knockLoad = 50_000

// BenchmarkKnockLatency is figure 4 of issue 17: while haves of 1,000
// other nodes are published at up to knockLoad a second and a reconciler
// folds them, a probe node reports a write-failed refusal and then a
// have; the time from the have's publish to the knock's arrival at an
// ordered consumer of the node's knock subject (as a provisioner reads
// it) is taken, 1,000 times. Interleaved with each, in the same load, the
// raw hop: a have of another probe node published, then read by an
// ordered consumer of its subject. It reports both p50 and p99 and the
// ratio of the p99s (target: ≤ 3), and the process's CPU per event of the
// load while the rounds ran. The load is a loadGen on its own loopback
// connections (the probes and the reconciler share an in-process one):
// `load-events/s` is the rate the stream stored, `fold-events/s` the rate
// the reconciler folded (its meshfold_events_folded_total) while the
// rounds ran, and `backlog-events` what it had not folded at their end.
// A load above the rate the reconciler folds grows the backlog, and each
// knock waits behind it: the load holds while more than
// MESHFOLD_KNOCK_BACKLOG (default 1,000) of its events are unfolded
// (holdAbove), so that it runs at most at the rate the reconciler
// sustains (at that rate a knock waits behind the held backlog: the
// goal's figure is taken at a rate below it); MESHFOLD_KNOCK_RATE=N offers N events/s instead of knockLoad
// (BenchmarkKnockLoadCeiling's fold-* measure the rate sustained), and
// loadGenFromEnv's knobs set the generator.
//
// MESHFOLD_KNOCK_NODES=N makes the other nodes N rather than 1,000 (issue
// 27 asks for 100,000: make bench-scale); the probes start once the stream
// has stored a have of each of them, so that the reconciler holds every
// node's state while the rounds run.
//
//	go test ./engine -run '^$' -bench KnockLatency -benchtime 1x
func BenchmarkKnockLatency(b *testing.B) {
	nodes := envInt(b, "MESHFOLD_KNOCK_NODES", 1_000, 1, "a count of nodes")
	haves := knockHaves(nodes)
	mode, nconns, window := loadGenFromEnv(b)
	rate := knockRate(b)
	// 1,000 rounds: the p99 of 200 was the second slowest round, and
	// one slow round moved the ratio by half.
	const rounds = 1_000
	for range b.N {
		e, _, js, _, cfg := storetest.StartStream(b, store.StreamConfig{})
		subj := cfg.Subjects()
		pub := store.NewPublisher(js, subj)
		ctx, cancel := context.WithCancel(context.Background())
		reg := prometheus.NewRegistry() // the fold's pace: events folded, the backlog
		metrics := engine.NewMetrics(reg)
		// Signing its knocks, as every deployed reconciler does.
		r, err := engine.NewReconciler(ctx, js, engine.ReconcilerConfig{Stream: cfg, Signer: benchSigner(b), Metrics: metrics})
		if err != nil {
			b.Fatal(err)
		}
		stopped := make(chan error, 1)
		go func() { stopped <- r.Run(ctx) }()
		at := time.Date(2026, 11, 3, 20, 50, 0, 0, time.UTC)
		appendSync := func(node string, p events.Payload) uint64 {
			a, err := pub.Append(ctx, node, events.Stamp(p, at))
			if err != nil {
				b.Fatal(err)
			}
			return a.Seq
		}
		follow := func(node string, k events.Kind) *store.Tail {
			t, err := store.Follow(ctx, js, store.TailConfig{Stream: cfg.Name, Filter: subj.Stored(node, k), New: true})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(t.Stop)
			return t
		}
		next := func(t *store.Tail) uint64 {
			select {
			case it := <-t.C():
				if it.Err != nil {
					b.Fatal(it.Err)
				}
				return it.Meta.Sequence.Stream
			case <-time.After(30 * time.Second):
				b.Fatalf("nothing arrived within 30 s (the reconciler's backlog: %.0f messages; a load above the rate it folds?)", gathered(b, reg)[lagName])
			}
			return 0
		}
		// The probe: a plan it settles, naming the provisioner account.
		const probe, rawProbe = "knock-probe", "raw-probe"
		plans := follow(probe, events.KindPlan)
		appendSync(probe, &events.Want{Modules: []events.WantModule{{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true}}})
		plan := next(plans)
		appendSync(probe, &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: plan})
		knocks := follow(probe, events.KindKnock)
		raws := follow(rawProbe, events.KindHave)
		have := &events.Have{Modules: []events.HaveModule{{Name: "provisioner", Build: "p:1", State: events.Running, Account: "prov"}}}

		// The load: its own connections over loopback TCP, as nodes
		// publish (loadGen).
		gctx, stopLoad := context.WithCancel(ctx)
		defer stopLoad()
		hold, watch := holdAbove(gctx, b, reg, gathered(b, reg)[foldedName])
		g := startLoadGen(gctx, b, loadGenConfig{Msgs: haves, Rate: rate, Conns: dialLoad(b, e.ClientURL(), nconns), Window: window, Mode: mode, Hold: hold})
		watch(g)
		loadDone, sent := g.done, &g.acked
		time.Sleep(time.Second) // the load running before the first probe
		// Each node has two haves a round, node after node: the first
		// 2×nodes haves name every node.
		for deadline := time.Now().Add(5 * time.Minute); sent.Load() < int64(min(len(haves), 2*nodes)); {
			if time.Now().After(deadline) {
				b.Fatalf("the load sent %d haves in 5 minutes, want %d", sent.Load(), 2*nodes)
			}
			time.Sleep(10 * time.Millisecond)
		}
		// Under -test.trace, each round is a task of the trace, and the
		// probe's partition is noted (the session's checkpoints are
		// regions of the engine's), to find where a slow knock waited.
		trace.Logf(ctx, "probe-partition", "%d", subj.Partition(probe))
		start, sent0, cpu0, folded0 := time.Now(), sent.Load(), cpuTime(b), gathered(b, reg)[foldedName]
		var knock, raw []time.Duration
		for i := range rounds {
			_, task := trace.NewTask(ctx, "raw")
			t0 := time.Now()
			appendSync(rawProbe, have)
			next(raws)
			raw = append(raw, time.Since(t0))
			task.End()
			appendSync(probe, &events.Refusal{Module: "provisioner", Path: fmt.Sprintf("/run/p/%d", i),
				Reason: events.ReasonWriteFailed, Plan: plan, Writer: "prov", Error: "disk full"})
			_, task = trace.NewTask(ctx, "knock")
			t0 = time.Now()
			hs := appendSync(probe, have)
			ks := next(knocks)
			task.End()
			if ks <= hs {
				b.Fatalf("knock at %d, not after the have at %d", ks, hs)
			}
			knock = append(knock, time.Since(t0))
		}
		took := time.Since(start)
		loaded := sent.Load() - sent0
		reached := float64(loaded) / took.Seconds()
		// The process's CPU (server, load, reconciler, probes) per event
		// of the load while the rounds ran: the rate reached swings with
		// the machine's load, the CPU an event less.
		cpu := float64(cpuTime(b)-cpu0) / float64(loaded)
		folded, backlog := gathered(b, reg)[foldedName]-folded0, gathered(b, reg)[lagName]
		stopLoad()
		<-loadDone
		cancel()
		<-stopped
		pct := func(d []time.Duration, q float64) float64 {
			slices.Sort(d)
			return float64(d[int(q*float64(len(d)-1))].Microseconds()) / 1000
		}
		b.ReportMetric(float64(nodes), "other-nodes")
		b.ReportMetric(reached, "load-events/s")
		b.ReportMetric(float64(folded)/took.Seconds(), "fold-events/s")
		b.ReportMetric(float64(backlog), "backlog-events")
		b.ReportMetric(cpu, "cpu-ns/event")
		b.ReportMetric(pct(raw, 0.5), "raw-p50-ms")
		b.ReportMetric(pct(raw, 0.99), "raw-p99-ms")
		b.ReportMetric(pct(knock, 0.5), "knock-p50-ms")
		b.ReportMetric(pct(knock, 0.99), "knock-p99-ms")
		b.ReportMetric(pct(knock, 0.99)/pct(raw, 0.99), "p99-ratio")
	}
}
