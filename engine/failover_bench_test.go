package engine_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

var failoverKills = flag.Int("failover-kills", 20, "BenchmarkClusterFailover: kills of each kind")

// BenchmarkClusterFailover measures, on a 3-server cluster of nats-server
// processes (R3) under a group of two reconcilers with the default lease
// TTL, the time from a kill to the first plan of a want sent right after
// it: for the server leading the stream and the server leading the lease
// bucket (SIGKILL; restarted, and the group settled, before the next
// kill), and for a member of the group (its connection closed under it,
// as a crash; a new member of the same name joins before the next kill).
// p50-ms and p99-ms per kind, over -failover-kills kills each (20).
//
//	go test ./engine -run '^$' -bench ClusterFailover -benchtime 1x -timeout 60m
func BenchmarkClusterFailover(b *testing.B) {
	for range b.N {
		pc := storetest.StartProcCluster(b, 3)
		_, js := pc.Connect(b)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		stream, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		pub := store.NewPublisher(js, cfg.Subjects())
		ttl := engine.DefaultLeaseTTL
		a := startBenchMember(b, pc.Connect, cfg, "a", ttl, engine.Faults{})
		m := startBenchMember(b, pc.Connect, cfg, "b", ttl, engine.Faults{})
		settled := func() {
			deadline := time.Now().Add(3 * time.Minute)
			for len(a.g.Owned()) != 8 || len(m.g.Owned()) != 8 || len(a.r.Owned()) != 8 || len(m.r.Owned()) != 8 {
				if time.Now().After(deadline) {
					b.Fatalf("the group did not settle: a %v, b %v", a.r.Owned(), m.r.Owned())
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		settled()
		node := nodesIn(cfg.Partitions, 0, 8, 1)[0] // a's half
		build := 0
		// planAfter sends a new want of node and returns the time from
		// killed to its plan.
		planAfter := func(killed time.Time) time.Duration {
			build++
			w := events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "app", Build: fmt.Sprintf("a:%d", build)}}}, time.Now().UTC())
			var seq uint64
			for {
				actx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				ack, err := pub.Append(actx, node, w, store.WithMsgID(fmt.Sprintf("failover-%d", build)))
				cancel()
				if err == nil {
					seq = ack.Seq
					break
				}
				if time.Since(killed) > 3*time.Minute {
					b.Fatalf("append: %v", err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			for {
				qctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				msg, err := store.LastMsg(qctx, stream, cfg.Subjects(), node, events.KindPlan)
				cancel()
				if err == nil {
					if p, ok := msg.Event.Payload.(*events.Plan); ok && p.Cause >= seq {
						return time.Since(killed)
					}
				}
				if time.Since(killed) > 3*time.Minute {
					b.Fatalf("no plan of want %d %v after the kill", seq, time.Since(killed))
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		report := func(kind string, ds []time.Duration) {
			slices.Sort(ds)
			p := func(q float64) time.Duration { return ds[max(0, int(float64(len(ds))*q+0.999999)-1)] }
			b.Logf("%s: %d kills, first plan of a new want after p50 %v, p99 %v (min %v, max %v); all %v", kind, len(ds),
				p(0.5).Round(time.Millisecond), p(0.99).Round(time.Millisecond), ds[0].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond), ds)
			b.ReportMetric(float64(p(0.5).Milliseconds()), kind+"-p50-ms")
			b.ReportMetric(float64(p(0.99).Milliseconds()), kind+"-p99-ms")
		}
		for _, k := range []chaosKill{{"stream", cfg.Name}, {"lease", "KV_" + cfg.Name + engine.LeaseBucketSuffix}} {
			var ds []time.Duration
			for range *failoverKills {
				leader := -1
				for leader < 0 {
					qctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					leader = pc.Leader(qctx, js, k.stream)
					cancel()
				}
				killed := time.Now()
				pc.Kill(leader)
				ds = append(ds, planAfter(killed))
				pc.Restart(leader)
				settled()
			}
			report(k.what, ds)
		}
		var ds []time.Duration
		for range *failoverKills {
			killed := time.Now()
			a.nc.Close()
			a.cancel()
			ds = append(ds, planAfter(killed))
			<-a.done
			a = startBenchMember(b, pc.Connect, cfg, "a", ttl, engine.Faults{})
			settled()
		}
		report("instance", ds)
	}
}

// BenchmarkBucketElection measures how long an R3 KV bucket takes no
// write after the server leading it is killed with SIGKILL: from the
// kill to the first put that succeeds (each put bounded by 500 ms,
// tried every 20 ms), over -failover-kills kills (20), the server
// restarted between kills. The lease TTL must outlive it.
//
//	go test ./engine -run '^$' -bench BucketElection -benchtime 1x -timeout 30m
func BenchmarkBucketElection(b *testing.B) {
	for range b.N {
		pc := storetest.StartProcCluster(b, 3)
		_, js := pc.Connect(b)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "ELECTION", Replicas: 3, Storage: jetstream.FileStorage})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		var ds []time.Duration
		for range *failoverKills {
			leader := -1
			for leader < 0 {
				qctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				leader = pc.Leader(qctx, js, "KV_ELECTION")
				cancel()
			}
			killed := time.Now()
			pc.Kill(leader)
			for {
				pctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				_, err := kv.Put(pctx, "k", []byte("v"))
				cancel()
				if err == nil {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			ds = append(ds, time.Since(killed))
			pc.Restart(leader)
		}
		slices.Sort(ds)
		b.Logf("%d kills of the bucket's leader: no write for %v (p50) to %v (max); all %v", len(ds), ds[len(ds)/2], ds[len(ds)-1], ds)
		b.ReportMetric(float64(ds[len(ds)/2].Milliseconds()), "p50-ms")
		b.ReportMetric(float64(ds[len(ds)-1].Milliseconds()), "max-ms")
	}
}

var (
	leaderKills = flag.Int("leader-kills", 10, "BenchmarkLeaderFailover: leader kills, alternately of the stream and of the lease bucket")
	leaderLog   = flag.String("leader-log", "", "BenchmarkLeaderFailover: write the reconciler's log (debug) to this file")
)

// BenchmarkLeaderFailover's bounds: every wait of the benchmark ends, and
// fails it with what it waited for, instead of hanging.
const (
	// failoverLimit bounds each recovery after a kill (raw or the
	// reconciler's first plan), and the settling after a restart.
	failoverLimit = 3 * time.Minute
	// probeEvery is how often a new attempt of a raw probe, or of the
	// want's publish, is started while the earlier ones are still
	// waiting: the first that succeeds times the recovery, so a request
	// sent into the election and waiting out its own deadline does not.
	probeEvery = 100 * time.Millisecond
	// probeStep bounds each request of a probe.
	probeStep = time.Second
)

// BenchmarkLeaderFailover measures what a leader's crash costs the
// reconciler beyond what it costs JetStream itself (issue 24): on a
// 3-server cluster of nats-server processes (R3) under one ungrouped
// reconciler (engine.Serve), it kills with SIGKILL the server leading the
// stream, then the one leading the lease bucket, alternately,
// -leader-kills times (10), and times from each kill, in the same run:
//   - raw: JetStream's own recovery, until a raw round trip works again
//     on each of the stream (a publish, then its read through a new
//     consumer, as the reconciler reads), the lease bucket and the
//     snapshot bucket (a put, then a get of it); an attempt is started
//     every probeEvery (100 ms), each request bounded by probeStep (1 s),
//     and the first to succeed times it;
//   - reconciler: the first plan of a want sent right after the kill (its
//     publish attempted as the raw probes are);
//   - difference: reconciler minus raw, the reconciler's own cost (the
//     target: at most 1 s on every kill).
//
// It prints each kill as it happens (stderr), then p50 and max of each
// figure, per kind and over all kills. The server is restarted, and the
// reconciler plans again, before the next kill. Every wait is bounded
// (failoverLimit) and fails the benchmark saying what it waited for.
//
//	go test ./engine -run '^$' -bench LeaderFailover -benchtime 1x -timeout 30m
func BenchmarkLeaderFailover(b *testing.B) {
	for range b.N {
		quiet := nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}) // no "broken pipe" lines on stderr
		pc := storetest.StartProcCluster(b, 3)
		_, js := pc.Connect(b, quiet)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		stream, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		pub := store.NewPublisher(js, cfg.Subjects())
		rnc, _ := pc.Connect(b, quiet)
		rctx, rcancel := context.WithCancel(context.Background())
		served := make(chan error, 1)
		log := slog.New(slog.DiscardHandler)
		if *leaderLog != "" {
			f, err := os.Create(*leaderLog)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			log = slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
		go func() { served <- engine.Serve(rctx, rnc, engine.Config{Stream: cfg, Logger: log}) }()
		b.Cleanup(func() {
			rcancel()
			select {
			case <-served:
			case <-time.After(time.Minute):
				dumpGoroutines()
				b.Errorf("the reconciler did not stop within a minute of its context ending (goroutines on stderr)")
			}
		})
		const node = "vic"
		build := 0
		// planAfter sends a new want of node and returns the time from
		// since to its plan.
		planAfter := func(since time.Time) time.Duration {
			build++
			w := events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "app", Build: fmt.Sprintf("a:%d", build)}}}, time.Now().UTC())
			id := fmt.Sprintf("leader-failover-%d", build)
			var seq atomic.Uint64
			_, published, err := firstSuccess(since, func() bool {
				actx, cancel := context.WithTimeout(context.Background(), probeStep)
				defer cancel()
				ack, err := pub.Append(actx, node, w, store.WithMsgID(id)) // one message, however many attempts
				if err != nil {
					return false
				}
				seq.Store(ack.Seq)
				return true
			})
			defer published() // the attempts still waiting: after the plan is timed
			if err != nil {
				b.Fatalf("the want of build %d was not stored: %v", build, err)
			}
			for {
				qctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				msg, err := store.LastMsg(qctx, stream, cfg.Subjects(), node, events.KindPlan)
				cancel()
				if err == nil {
					if p, ok := msg.Event.Payload.(*events.Plan); ok && p.Cause >= seq.Load() {
						return time.Since(since)
					}
				}
				if time.Since(since) > failoverLimit {
					b.Fatalf("no plan of the want at sequence %d %v after the kill", seq.Load(), time.Since(since).Round(time.Millisecond))
				}
				select {
				case err := <-served:
					b.Fatalf("the reconciler stopped: %v", err)
				default:
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		planAfter(time.Now()) // the reconciler is up
		var probes atomic.Int64
		// rawStream is one publish on the stream and its read (through a
		// new consumer from its sequence, as the reconciler reads), on a
		// journal of a node nobody folds: not an input of the reconciler.
		rawStream := func() bool {
			n := probes.Add(1)
			ctx, cancel := context.WithTimeout(context.Background(), probeStep)
			defer cancel()
			j := events.Stamp(&events.Journal{Level: events.LevelInfo, Msg: fmt.Sprintf("probe %d", n)}, time.Now())
			ack, err := pub.Append(ctx, "rawprobe", j, store.WithMsgID(fmt.Sprintf("raw-probe-%d", n)))
			if err != nil {
				return false
			}
			ctx2, cancel2 := context.WithTimeout(context.Background(), probeStep)
			defer cancel2()
			cons, err := js.CreateConsumer(ctx2, cfg.Name, jetstream.ConsumerConfig{
				FilterSubject: cfg.Subjects().Stored("rawprobe", events.KindJournal),
				DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: ack.Seq,
				AckPolicy: jetstream.AckNonePolicy, Replicas: 1, MemoryStorage: true, InactiveThreshold: 5 * time.Second})
			if err != nil {
				return false
			}
			m, err := cons.Next(jetstream.FetchMaxWait(probeStep))
			return err == nil && m != nil
		}
		// rawKV is one put and get of a key of bucket that no reconciler
		// reads.
		rawKV := func(bucket string) func() bool {
			kctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			kv, err := js.KeyValue(kctx, bucket)
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			return func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), probeStep)
				defer cancel()
				rev, err := kv.Put(ctx, "probe.raw", []byte("x"))
				if err != nil {
					return false
				}
				ctx2, cancel2 := context.WithTimeout(context.Background(), probeStep)
				defer cancel2()
				e, err := kv.Get(ctx2, "probe.raw")
				return err == nil && e.Revision() >= rev
			}
		}
		// JetStream's own recovery: every raw round trip the reconciler
		// depends on works again (the stream, the lease bucket, the
		// snapshot bucket; a killed server may lead more than one).
		raws := map[string]func() bool{"stream": rawStream, "lease bucket": rawKV(cfg.Name + engine.LeaseBucketSuffix),
			"snapshot bucket": rawKV(cfg.Name + store.SnapshotBucketSuffix)}
		rawRecovery := func(killed time.Time) (time.Duration, error) {
			var (
				wg   sync.WaitGroup
				mu   sync.Mutex
				last time.Duration
				errs []error
			)
			for what, raw := range raws {
				wg.Go(func() {
					at, wait, err := firstSuccess(killed, raw)
					wait()
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						errs = append(errs, fmt.Errorf("%s: %w", what, err))
					}
					last = max(last, at)
				})
			}
			wg.Wait()
			return last, errors.Join(errs...)
		}
		type result struct{ raw, rec time.Duration }
		byKind := map[string][]result{}
		var kills []string
		kinds := []struct{ what, stream string }{{"stream", cfg.Name}, {"lease", "KV_" + cfg.Name + engine.LeaseBucketSuffix}}
		for i := range *leaderKills {
			k := kinds[i%len(kinds)]
			leader := -1
			for deadline := time.Now().Add(time.Minute); leader < 0; {
				if time.Now().After(deadline) {
					b.Fatalf("kill %d: no server leads %s after a minute", i+1, k.stream)
				}
				qctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				leader = pc.Leader(qctx, js, k.stream)
				cancel()
			}
			killed := time.Now()
			pc.Kill(leader)
			type rawResult struct {
				d   time.Duration
				err error
			}
			rawDone := make(chan rawResult, 1)
			go func() {
				d, err := rawRecovery(killed)
				rawDone <- rawResult{d, err}
			}()
			rec := planAfter(killed)
			rr := <-rawDone // bounded: firstSuccess gives up after failoverLimit
			if rr.err != nil {
				b.Fatalf("kill %d (%s leader %s): JetStream itself did not recover: %v", i+1, k.what, pc.Name(leader), rr.err)
			}
			raw := rr.d
			byKind[k.what] = append(byKind[k.what], result{raw, rec})
			log.Info("bench: killed", "kill", i+1, "what", k.what, "server", pc.Name(leader), "at", killed, "raw", raw, "reconciler", rec)
			line := fmt.Sprintf("kill %d (%s leader %s): raw %v, reconciler %v, difference %v", i+1, k.what, pc.Name(leader),
				raw.Round(time.Millisecond), rec.Round(time.Millisecond), (rec - raw).Round(time.Millisecond))
			fmt.Fprintf(os.Stderr, "BenchmarkLeaderFailover: %s\n", line) // as it happens: a long run shows where it is
			kills = append(kills, fmt.Sprintf("%d %s %.2f/%.2f/%+.2f", i+1, k.what, raw.Seconds(), rec.Seconds(), (rec-raw).Seconds()))
			pc.Restart(leader)
			if err := pc.WaitHealthy(leader, time.Minute); err != nil {
				b.Fatal(err)
			}
			planAfter(time.Now())
		}
		stat := func(ds []time.Duration) (p50, mx time.Duration) {
			slices.Sort(ds)
			return ds[(len(ds)-1)/2], ds[len(ds)-1]
		}
		var all []result
		for _, k := range kinds {
			all = append(all, byKind[k.what]...)
		}
		// The figures first: a benchmark's log is cut after 10 lines.
		for _, g := range []struct {
			name string
			rs   []result
		}{{"all", all}, {"stream", byKind["stream"]}, {"lease", byKind["lease"]}} {
			if len(g.rs) == 0 {
				continue
			}
			var raw, rec, diff []time.Duration
			over := 0
			for _, r := range g.rs {
				raw, rec, diff = append(raw, r.raw), append(rec, r.rec), append(diff, r.rec-r.raw)
				if r.rec-r.raw > time.Second {
					over++
				}
			}
			r50, rmx := stat(raw)
			c50, cmx := stat(rec)
			d50, dmx := stat(diff)
			b.Logf("%s: %d kills: raw (JetStream) p50 %v max %v; reconciler p50 %v max %v; difference p50 %v max %v; over 1 s: %d",
				g.name, len(g.rs), r50.Round(time.Millisecond), rmx.Round(time.Millisecond), c50.Round(time.Millisecond),
				cmx.Round(time.Millisecond), d50.Round(time.Millisecond), dmx.Round(time.Millisecond), over)
			if g.name == "all" {
				b.ReportMetric(float64(r50.Milliseconds()), "raw-p50-ms")
				b.ReportMetric(float64(rmx.Milliseconds()), "raw-max-ms")
				b.ReportMetric(float64(c50.Milliseconds()), "reconciler-p50-ms")
				b.ReportMetric(float64(cmx.Milliseconds()), "reconciler-max-ms")
			}
			b.ReportMetric(float64(d50.Milliseconds()), g.name+"-diff-p50-ms")
			b.ReportMetric(float64(dmx.Milliseconds()), g.name+"-diff-max-ms")
		}
		b.Logf("kills (raw/reconciler/difference, s): %s", strings.Join(kills, "; "))
	}
}

// firstSuccess starts attempt at once and then every probeEvery, each
// beside the ones still running, until one succeeds; it returns the time
// from start to that success as soon as it comes, and wait, which
// returns once every attempt started has returned (each must bound
// itself). It gives up when failoverLimit has passed since start.
func firstSuccess(start time.Time, attempt func() bool) (at time.Duration, wait func(), err error) {
	var (
		wg   sync.WaitGroup
		once sync.Once
	)
	done := make(chan struct{})
	launch := func() {
		wg.Go(func() {
			if attempt() {
				once.Do(func() { at = time.Since(start); close(done) })
			}
		})
	}
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	limit := time.NewTimer(failoverLimit - time.Since(start))
	defer limit.Stop()
	launch()
	for {
		select {
		case <-done:
			return at, wg.Wait, nil
		case <-t.C:
			launch()
		case <-limit.C:
			wg.Wait()
			select {
			case <-done:
				return at, wg.Wait, nil
			default:
			}
			return 0, wg.Wait, fmt.Errorf("no attempt succeeded within %v", failoverLimit)
		}
	}
}

// dumpGoroutines writes every goroutine's stack to stderr.
func dumpGoroutines() {
	buf := make([]byte, 1<<22)
	fmt.Fprintf(os.Stderr, "%s\n", buf[:runtime.Stack(buf, true)])
}
