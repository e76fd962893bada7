package rollouts_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/engine/rollouts"
	"github.com/meshfold/meshfold/engine/rollouts/rolloutstest"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/rollout/fleetfile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// BenchmarkRollout10k is issue 23's figure: a rollout over 10,000
// stand-in nodes (rolloutstest.Answer answers each plan with settles and a
// have) through an embedded server and the reconciler, against the same
// run's baseline: the same 10,000 wants published with no controller
// logic, planned, settled and reported, the least time that flow takes.
// It reports the ratio (goal ≤ 1.25) and the controller's state per
// target (the heap a replay of the finished rollout keeps: see
// retainedPerTarget). The rollout
// lets every target change at once (batch and max_unavailable 100%,
// min_healthy 0s), as the baseline does. MESHFOLD_ROLLOUT_NODES sets
// the node count.
func BenchmarkRollout10k(b *testing.B) {
	n := 10000
	if s := os.Getenv("MESHFOLD_ROLLOUT_NODES"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	_, nc, js, stream, cfg := storetest.StartStream(b, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	// The reconciler, without the controller: the rollout's runs below.
	rctx, stopR := context.WithCancel(ctx)
	rdone := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		rdone <- engine.Serve(rctx, nc, engine.Config{Stream: cfg, NoRollouts: true,
			Ready: func(context.Context, *engine.Reconciler) { close(ready) }})
	}()
	defer func() { stopR(); <-rdone }()
	<-ready
	actx, stopA := context.WithCancel(ctx)
	adone := make(chan error, 1)
	go func() { adone <- rolloutstest.Answer(actx, js, cfg, 0, nil) }()
	defer func() { stopA(); <-adone }()

	nodes := make([]string, n)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("n%05d", i)
	}
	subj := cfg.Subjects()
	pub := store.NewPublisher(js, subj)
	// publishWants publishes every node's want of build, without waiting
	// for each acknowledgement, and waits until every node reported it
	// running.
	flow := func(build string, publish func()) time.Duration {
		from, err := store.StreamLastSeq(ctx, stream)
		if err != nil {
			b.Fatal(err)
		}
		began := time.Now()
		seen := waitHaves(b, ctx, js, cfg, from+1, build, n)
		publish()
		<-seen
		return time.Since(began)
	}
	wantsOf := func(build string) func() {
		return func() {
			var futs []jetstream.PubAckFuture
			wait := func() {
				for _, f := range futs {
					select {
					case <-f.Ok():
					case err := <-f.Err():
						b.Fatal(err)
					}
				}
				futs = futs[:0]
			}
			for _, node := range nodes {
				f, err := pub.AppendAsync(ctx, node, events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: build}}}, time.Now()))
				if err != nil {
					b.Fatal(err)
				}
				if futs = append(futs, f); len(futs) == 1024 {
					wait()
				}
			}
			wait()
		}
	}
	b.ResetTimer()
	for range b.N {
		flow("web:0", wantsOf("web:0"))             // the nodes' first wants
		baseline := flow("web:1", wantsOf("web:1")) // the same flow, no controller

		var y strings.Builder
		y.WriteString("fleet: web\nnodes:\n")
		for _, node := range nodes {
			y.WriteString("  " + node + ": {}\n")
		}
		y.WriteString("groups: [{name: all, select: {}, modules: [{name: web, build: \"web:2\"}]}]\nrollout: {batch: 100%, max_unavailable: 100%, min_healthy: 0s}\n")
		f, _, err := fleetfile.Parse([]byte(y.String()))
		if err != nil {
			b.Fatal(err)
		}
		plan, err := feed.NewPlan(ctx, stream, subj, f, "bench", "")
		if err != nil {
			b.Fatal(err)
		}
		cctx, stopC := context.WithCancel(ctx)
		cdone := make(chan error, 1)
		var id uint64
		took := flow("web:2", func() {
			if id, err = plan.Apply(ctx, js, subj); err != nil {
				b.Fatal(err)
			}
			go func() { cdone <- rollouts.RunFleet(cctx, js, rollouts.Config{Stream: cfg}, "web") }()
		})
		<-waitRecord(b, ctx, js, cfg, id, string(rollout.Completed))
		stopC()
		if err := <-cdone; err != nil {
			b.Fatal(err)
		}

		perTarget, spread := retainedPerTarget(b, ctx, js, cfg, n)
		ratio := took.Seconds() / baseline.Seconds()
		b.ReportMetric(took.Seconds(), "rollout-s")
		b.ReportMetric(baseline.Seconds(), "baseline-s")
		b.ReportMetric(ratio, "ratio")
		b.ReportMetric(perTarget, "B/target")
		b.Logf("%d nodes: rollout (apply to every node running the new build) %s, baseline (the same wants, plans, settles and haves, no controller) %s: ratio %.2f (goal ≤ 1.25); controller state %.0f B/target (median of %d rounds: %.0f)",
			n, took.Round(time.Millisecond), baseline.Round(time.Millisecond), ratio, perTarget, len(spread), spread)
	}
}

// retainedPerTarget returns the heap a controller's state keeps per target
// (bytes, the median over rounds) and each round's figure. The state is
// feed.Replay's of the finished rollout, as the controller rebuilds it.
//
// The embedded server, the reconciler and the stand-in nodes share the
// process and allocate and free beside the measurement (a difference taken
// before and after a replay came out negative on a loaded machine: the
// server's block caches expired in between). So each round measures the
// heap retained by the states themselves: copies replays held alive, two
// collections, HeapAlloc; then the states dropped, two collections,
// HeapAlloc again. Nothing runs between the two readings but the
// collections, the replays' own garbage is gone from both, and the copies
// make the states' share large beside what the rest of the process moves.
func retainedPerTarget(b *testing.B, ctx context.Context, js jetstream.JetStream, cfg store.StreamConfig, n int) (float64, []float64) {
	const copies, rounds = 2, 3
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	var per []float64
	for range rounds {
		states := make([]*rollout.State, copies)
		for i := range states {
			s, err := feed.Replay(ctx, js, cfg, nil, "web")
			if err != nil {
				b.Fatal(err)
			}
			if s.Rollout.Phase != rollout.Completed {
				b.Fatalf("rollout %s", s.Rollout.Phase)
			}
			states[i] = s
		}
		alive := heap()
		runtime.KeepAlive(states)
		clear(states)
		states = nil
		dropped := heap()
		per = append(per, float64(int64(alive)-int64(dropped))/float64(copies*n))
	}
	sorted := slices.Clone(per)
	slices.Sort(sorted)
	return sorted[len(sorted)/2], per
}

// waitHaves follows the haves stored from seq on and closes the returned
// channel once n distinct nodes reported web at build.
func waitHaves(b *testing.B, ctx context.Context, js jetstream.JetStream, cfg store.StreamConfig, seq uint64, build string, n int) <-chan struct{} {
	subj := cfg.Subjects()
	tail, err := store.Follow(ctx, js, store.TailConfig{Stream: cfg.Name, Subjects: subj, Filter: "*." + subj.Event("*", events.KindHave), Start: seq})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer tail.Stop()
		seen := map[string]bool{}
		for len(seen) < n {
			m, err := tail.Next(ctx)
			if err != nil {
				return
			}
			if h, ok := m.Event.Payload.(*events.Have); ok && len(h.Modules) == 1 && h.Modules[0].Build == build {
				seen[m.Event.Node] = true
			}
		}
		close(done)
	}()
	return done
}

// waitRecord returns a channel closed once rollout id records what.
func waitRecord(b *testing.B, ctx context.Context, js jetstream.JetStream, cfg store.StreamConfig, id uint64, what string) <-chan struct{} {
	subj := cfg.Subjects()
	tail, err := store.Follow(ctx, js, store.TailConfig{Stream: cfg.Name, Subjects: subj, Filter: subj.Rollout("web", string(rollout.KindRecord)), Start: id})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer tail.Stop()
		for {
			select {
			case x := <-tail.C():
				if x.Err != nil {
					return
				}
				p, err := rollout.Decode(rollout.KindRecord, x.Msg.Data())
				if r, ok := p.(*rollout.Record); err == nil && ok && r.Rollout == id && r.What == what {
					close(done)
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return done
}
