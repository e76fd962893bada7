package engine_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/engine/enginetest"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// catchUp runs a reconciler from the stream's snapshots and returns how
// long until every partition's checkpoint covers its last input event, and
// the reconciler, still running: stop it with cancel and wait on done.
func catchUp(tb testing.TB, js jetstream.JetStream, cfg store.StreamConfig, targets map[int]uint64) (time.Duration, *engine.Reconciler, context.CancelFunc, chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	start := time.Now()
	r, err := engine.NewReconciler(ctx, js, engine.ReconcilerConfig{Stream: cfg, SnapshotInterval: benchSnapshotInterval})
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	took := enginetest.WaitCheckpoints(tb, snaps, targets, start)
	return took, r, cancel, done
}

// foldAll runs a reconciler with the default snapshot cadence until it
// has folded every partition to its last input event (Progress), then
// stops it gracefully, which waits for every ack and writes the last
// snapshot, and returns the whole time. A session that restarted (its
// server unanswered) may leave effects to the next start: a test that
// reads them from the stream waits with foldAllStored.
func foldAll(tb testing.TB, js jetstream.JetStream, cfg store.StreamConfig) time.Duration {
	return foldAllWith(tb, js, engine.ReconcilerConfig{Stream: cfg})
}

// foldAllWith is [foldAll] by a reconciler of configuration rcfg.
func foldAllWith(tb testing.TB, js jetstream.JetStream, rcfg engine.ReconcilerConfig) time.Duration {
	cfg := rcfg.Stream
	targets := enginetest.InputTargets(tb, js, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	r, err := engine.NewReconciler(ctx, js, rcfg)
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for p, want := range targets {
		for r.Progress()[p] < want {
			time.Sleep(time.Millisecond)
		}
	}
	cancel()
	if err := <-done; err != nil {
		tb.Fatal(err)
	}
	return time.Since(start)
}

// benchSnapshotInterval is the snapshot interval of the benchmarks'
// reconcilers: short, because the end of a run is seen through the
// checkpoints, and the default second would add up to a second of idle
// time to every figure.
const benchSnapshotInterval = 20 * time.Millisecond

// BenchmarkReconcilerThroughput folds a 100k-event history over 1,000
// nodes whose effects are already stored (as after a crash: each is
// checked and skipped) and compares the time with a raw read of the same
// messages by the same kind of consumer, in the same run. Target: at least
// 75 % of the raw rate.
//
//	go test ./store -run '^$' -bench ReconcilerThroughput -benchtime 1x
func BenchmarkReconcilerThroughput(b *testing.B) {
	h := enginetest.Simulate(100_000, 1_000)
	n := len(h.Msgs)
	for range b.N {
		_, _, js, _, cfg := storetest.StartStream(b, store.StreamConfig{})
		sealed(b, js, cfg, h).Load(b, js)
		raw := enginetest.RawConsume(b, js, cfg, n)
		runtime.GC()
		took := foldAll(b, js, cfg)
		b.ReportMetric(float64(n)/raw.Seconds(), "raw-events/s")
		b.ReportMetric(float64(n)/took.Seconds(), "fold-events/s")
		b.ReportMetric(raw.Seconds()/took.Seconds(), "ratio")
	}
}

// BenchmarkReconcilerLive publishes 100k input events (wants, haves) over
// 1,000 nodes while a reconciler runs, from the first publish to the
// checkpoint covering the last one: consume, fold, publish the plans they
// cause, checkpoint. The baseline, in the same run, is a raw consumer
// reading while the same events are published.
func BenchmarkReconcilerLive(b *testing.B) { benchLive(b, nil) }

// BenchmarkReconcilerLiveTraced is BenchmarkReconcilerLive with tracing
// on: every fold and publish a span, batched to an exporter that drops
// them (the SDK's cost, not a collector's).
//
//	go test ./engine -run '^$' -bench 'ReconcilerLive' -benchtime 1x
func BenchmarkReconcilerLiveTraced(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	benchLive(b, tp)
}

func benchLive(b *testing.B, tp trace.TracerProvider) {
	h := enginetest.Simulate(200_000, 1_000)
	var inputs []*nats.Msg
	for _, m := range h.Msgs {
		if _, kind, _ := (events.Subjects{}).Parse(m.Subject); kind == events.KindWant || kind == events.KindHave {
			inputs = append(inputs, m)
		}
	}
	live := &enginetest.History{Msgs: inputs[:min(len(inputs), 100_000)]}
	for range b.N {
		_, _, js, _, cfg := storetest.StartStream(b, store.StreamConfig{})
		var raw time.Duration
		done := make(chan struct{})
		go func() { raw = enginetest.RawConsume(b, js, cfg, len(live.Msgs)); close(done) }()
		live.Load(b, js)
		<-done

		_, _, js2, _, cfg2 := storetest.StartStream(b, store.StreamConfig{})
		ctx, cancel := context.WithCancel(context.Background())
		// Default snapshot cadence: the end is seen through Progress, then
		// a graceful stop waits for every ack and writes the last
		// snapshot, which the time includes.
		r, err := engine.NewReconciler(ctx, js2, engine.ReconcilerConfig{Stream: cfg2, Tracing: tp})
		if err != nil {
			b.Fatal(err)
		}
		stopped := make(chan error, 1)
		go func() { stopped <- r.Run(ctx) }()
		start := time.Now()
		live.Load(b, js2)
		for p, want := range enginetest.InputTargets(b, js2, cfg2) {
			for r.Progress()[p] < want {
				time.Sleep(time.Millisecond)
			}
		}
		cancel()
		if err := <-stopped; err != nil {
			b.Fatal(err)
		}
		took := time.Since(start)
		b.ReportMetric(float64(len(live.Msgs))/raw.Seconds(), "raw-events/s")
		b.ReportMetric(float64(len(live.Msgs))/took.Seconds(), "fold-events/s")
		b.ReportMetric(raw.Seconds()/took.Seconds(), "ratio")
	}
}

// BenchmarkReconcilerRecovery measures a restart with snapshots after a
// short and a long history of the same 1,000 nodes: the time for a new
// reconciler to catch up with a tail of haves stored while none ran. With
// snapshots it should not depend on the history's length (target: 1M / 10k
// ≤ 1.5). A third case has 10,000 nodes, for the heap per node at that
// size (its restart loads ten times the snapshots).
//
//	go test ./store -run '^$' -bench ReconcilerRecovery -benchtime 1x -timeout 30m
func BenchmarkReconcilerRecovery(b *testing.B) {
	for _, c := range []struct{ events, nodes int }{{10_000, 1_000}, {1_000_000, 1_000}, {1_000_000, 10_000}} {
		b.Run(fmt.Sprintf("%dev-%dnodes", c.events, c.nodes), func(b *testing.B) {
			h := enginetest.Simulate(c.events, c.nodes)
			var tail []*nats.Msg
			for _, m := range h.Msgs[len(h.Msgs)-4000:] {
				if _, kind, _ := (events.Subjects{}).Parse(m.Subject); kind == events.KindHave {
					tail = append(tail, m)
				}
			}
			for range b.N {
				_, _, js, _, cfg := storetest.StartStream(b, store.StreamConfig{})
				sealed(b, js, cfg, h).Load(b, js)
				_, r, cancel, done := catchUp(b, js, cfg, enginetest.InputTargets(b, js, cfg))
				nodes := len(r.Nodes())
				// The heap while the reconciler runs minus the heap once it
				// is gone. This includes the embedded server's message
				// block caches, which it drops with the consumers (a heap
				// profile shows them dominating); the states alone are
				// measured by reconcile's BenchmarkStateMemory.
				runtime.GC()
				var running, gone runtime.MemStats
				runtime.ReadMemStats(&running)
				cancel()
				<-done
				r = nil
				runtime.GC()
				runtime.ReadMemStats(&gone)
				(&enginetest.History{Msgs: tail}).Load(b, js)
				took, _, cancel2, done2 := catchUp(b, js, cfg, enginetest.InputTargets(b, js, cfg))
				cancel2()
				<-done2
				b.ReportMetric(took.Seconds()*1000, "restart-ms")
				b.ReportMetric(float64(running.HeapAlloc-gone.HeapAlloc)/float64(nodes), "heap-B/node")
			}
		})
	}
}

// BenchmarkRefoldUnderRestarts measures what a reconciler refolds when
// it is killed faster than its snapshot interval (the default, 1 s):
// 68,000 wants and haves of 1,000 nodes are published at ~4,500/s while
// the reconciler crashes (a fault: nothing more published or
// checkpointed) every 450 ms and is started again, then runs to the end.
// refold-factor is the events it folded over the events stored (1.0: each
// folded once); checkpoints counts the snapshots written.
//
//	go test ./engine -run '^$' -bench RefoldUnderRestarts -benchtime 1x
func BenchmarkRefoldUnderRestarts(b *testing.B) {
	h := enginetest.Simulate(200_000, 1_000)
	var inputs []*nats.Msg
	for _, m := range h.Msgs {
		if _, kind, _ := (events.Subjects{}).Parse(m.Subject); kind == events.KindWant || kind == events.KindHave {
			inputs = append(inputs, m)
		}
	}
	inputs = inputs[:min(len(inputs), 90_000)]
	const every = 450 * time.Millisecond
	for range b.N {
		_, _, js, _, cfg := storetest.StartStream(b, store.StreamConfig{})
		pubDone := make(chan struct{})
		var pubErr error // set before pubDone closes; the goroutine never calls b.Fatal
		go func() {
			defer close(pubDone)
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for i := 0; i < len(inputs); i += 45 {
				<-tick.C
				if _, pubErr = (&enginetest.History{Msgs: inputs[i:min(i+45, len(inputs))]}).Publish(js); pubErr != nil {
					return
				}
			}
		}()
		var folded, checkpoints float64
		restarts := 0
		run := func(crash bool) {
			m := engine.NewMetrics(nil)
			start := time.Now()
			var f engine.Faults
			if crash {
				f.AfterFold = func(int, uint64) error {
					if time.Since(start) > every {
						return errCrash
					}
					return nil
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r, err := engine.NewReconciler(ctx, js, engine.ReconcilerConfig{Stream: cfg, Metrics: m, Faults: f})
			if err != nil {
				b.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			if crash {
				select {
				case err := <-done:
					if !errors.Is(err, errCrash) {
						b.Fatalf("reconciler ended with %v", err)
					}
					restarts++
				case <-pubDone:
					// Caught up with the last publish: no fold comes to
					// crash it. Stop it; the last run follows.
					cancel()
					if err := <-done; err != nil && !errors.Is(err, errCrash) {
						b.Fatal(err)
					}
				}
			} else {
				for p, want := range enginetest.InputTargets(b, js, cfg) {
					for r.Progress()[p] < want {
						time.Sleep(time.Millisecond)
					}
				}
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
			for _, k := range []events.Kind{events.KindWant, events.KindHave} {
				folded += testutil.ToFloat64(m.Folded.WithLabelValues(string(k)))
			}
			checkpoints += testutil.ToFloat64(m.Checkpoints)
		}
		for {
			select {
			case <-pubDone:
			default:
				run(true)
				continue
			}
			break
		}
		if pubErr != nil {
			b.Fatal(pubErr)
		}
		run(false)
		b.Logf("%d restarts, %.0f checkpoints, %.0f events folded for %d stored", restarts, checkpoints, folded, len(inputs))
		b.ReportMetric(folded/float64(len(inputs)), "refold-factor")
		b.ReportMetric(float64(restarts), "restarts")
		b.ReportMetric(checkpoints, "checkpoints")
	}
}
