package engine_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/engine/enginetest"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/embedded"
	"github.com/meshfold/meshfold/store/storetest"
)

// cpuTime is the process's CPU time so far, user and system.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchMember is a group member of a benchmark: a Group and a
// Reconciler on their own connection.
type benchMember struct {
	nc     *nats.Conn
	g      *engine.Group
	r      *engine.Reconciler
	cancel context.CancelFunc
	done   chan struct{}
}

func startBenchMember(tb testing.TB, connect connector, cfg store.StreamConfig, name string, ttl time.Duration, faults engine.Faults) *benchMember {
	nc, js := connect(tb, nats.Name("bench "+name))
	ctx, cancel := context.WithCancel(context.Background())
	g, err := engine.JoinGroup(ctx, js, engine.GroupConfig{Stream: cfg, Name: "bench", Instance: name, TTL: ttl})
	if err != nil {
		tb.Fatal(err)
	}
	r, err := engine.NewReconciler(ctx, js, engine.ReconcilerConfig{Stream: cfg, Grants: g.Grants(), Faults: faults,
		SnapshotInterval: benchSnapshotInterval})
	if err != nil {
		tb.Fatal(err)
	}
	m := &benchMember{nc: nc, g: g, r: r, cancel: cancel, done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = g.Run(ctx) }()
	go func() { defer wg.Done(); _ = r.Run(ctx) }()
	go func() { wg.Wait(); close(m.done) }()
	tb.Cleanup(func() { cancel(); <-m.done })
	return m
}

// preJoin puts the member keys of names in the group's bucket before the
// members start, so that each sees all of them from its first look and
// acquires only its share: no partition is started, then handed over.
func preJoin(tb testing.TB, js jetstream.JetStream, cfg store.StreamConfig, ttl time.Duration, names []string) {
	ctx := context.Background()
	if _, err := engine.JoinGroup(ctx, js, engine.GroupConfig{Stream: cfg, Name: "bench", Instance: "probe", TTL: ttl}); err != nil {
		tb.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, cfg.Name+engine.LeaseBucketSuffix)
	if err != nil {
		tb.Fatal(err)
	}
	for _, n := range names {
		if _, err := kv.Put(ctx, "member.bench."+n, []byte(`{"group":"bench","instance":"`+n+`"}`)); err != nil {
			tb.Fatal(err)
		}
	}
}

// BenchmarkGroupThroughput folds a 1M-event history of 10,000 nodes (its
// effects already stored, as after a crash: each is checked and skipped)
// on 16 partitions with 1, 2 and 4 reconciler instances of one group,
// each on its own connection, beside raw reads of the same messages
// (one ordered consumer a partition) in the same run: ratio against a
// read decoding with encoding/json (issue 17's baseline), ratio-fast
// against one decoding with the fold's own decoder. It reports the
// rates, the process's CPU time per event for both (the embedded server's
// share included in each: their difference is the reconciler's own), and,
// with one instance, the heap per node of an instance that loads the
// 10,000 states from the snapshots (see heapPerNode).
//
// This machine has 2 cores shared by the server and every instance, so
// the scaling cannot show here; the CPU per event is what scales out.
//
//	go test ./store -run '^$' -bench GroupThroughput -benchtime 1x -timeout 30m
func BenchmarkGroupThroughput(b *testing.B) {
	for _, k := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("%dinstances", k), func(b *testing.B) {
			for range b.N {
				e, _, js, _, cfg := storetest.StartStream(b, store.StreamConfig{})
				// Built for each run and dropped once stored: a history
				// kept alive through the run made every collection of
				// the fold scan its 1M messages, which the raw read's
				// did too, but weighed on the fold's CPU far more.
				h := enginetest.Simulate(1_000_000, 10_000)
				n := len(h.Msgs)
				sealed(b, js, cfg, h).Load(b, js)
				h = nil
				raw, rawCPU := timed(b, func() time.Duration { return enginetest.RawDecodeStd(b, js, cfg, n) })
				fast, fastCPU := timed(b, func() time.Duration { return enginetest.RawDecode(b, js, cfg, n) })
				targets := enginetest.InputTargets(b, js, cfg)
				const ttl = 5 * time.Second
				var names []string
				for i := range k {
					names = append(names, fmt.Sprintf("i%d", i))
				}
				preJoin(b, js, cfg, ttl, names)
				snaps, err := store.OpenSnapshots(context.Background(), js, cfg)
				if err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				cpu0 := cpuTime(b)
				start := time.Now()
				var ms []*benchMember
				for _, name := range names {
					ms = append(ms, startBenchMember(b, embeddedConnector(e), cfg, name, ttl, engine.Faults{}))
				}
				took := enginetest.WaitCheckpoints(b, snaps, targets, start)
				foldCPU := cpuTime(b) - cpu0
				for _, m := range ms {
					if got := len(m.r.Owned()); got != 16/k {
						b.Fatalf("an instance folded %d partitions, want %d", got, 16/k)
					}
				}
				b.ReportMetric(float64(n)/raw.Seconds(), "raw-events/s")
				b.ReportMetric(float64(n)/fast.Seconds(), "rawfast-events/s")
				b.ReportMetric(float64(n)/took.Seconds(), "fold-events/s")
				b.ReportMetric(raw.Seconds()/took.Seconds(), "ratio")
				b.ReportMetric(fast.Seconds()/took.Seconds(), "ratio-fast")
				b.ReportMetric(float64(rawCPU.Nanoseconds())/float64(n), "raw-cpu-ns/event")
				b.ReportMetric(float64(fastCPU.Nanoseconds())/float64(n), "rawfast-cpu-ns/event")
				b.ReportMetric(float64(foldCPU.Nanoseconds())/float64(n), "fold-cpu-ns/event")
				for _, m := range ms {
					m.cancel()
					<-m.done
				}
				if k == 1 {
					b.ReportMetric(heapPerNode(b, e, cfg, ttl), "heap-B/node")
				}
				ms = nil
			}
		})
	}
}

// heapPerNode starts one instance on the snapshots the stream's
// reconcilers left, waits until it holds every node, and returns its
// heap per node: the heap after GC while it runs, idle, minus the heap
// once it is gone. The server's message-block caches expire first (10 s
// idle), so what differs is the instance: its states as a taken-over
// partition loads them, its maps and its consumers.
func heapPerNode(b *testing.B, e *embedded.Server, cfg store.StreamConfig, ttl time.Duration) float64 {
	m := startBenchMember(b, embeddedConnector(e), cfg, "i0", ttl, engine.Faults{})
	for len(m.r.Nodes()) < 10_000 || len(m.r.Owned()) < 16 {
		time.Sleep(10 * time.Millisecond)
	}
	nodes := len(m.r.Nodes())
	time.Sleep(11 * time.Second)
	running := heapAfterGC()
	m.cancel()
	<-m.done
	m = nil
	gone := heapAfterGC()
	return float64(running-gone) / float64(nodes)
}

// heapAfterGC is the live heap after collections have settled (the
// strings interned by package unique are released a cycle later).
func heapAfterGC() int64 {
	var ms runtime.MemStats
	for range 3 {
		runtime.GC()
		time.Sleep(50 * time.Millisecond)
	}
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// BenchmarkGroupFailover measures a takeover on a 3-server cluster (R3)
// with the default lease TTL: two instances fold 1,000 nodes while haves
// arrive at ~2,000/s on every partition; the holder of partitions 0–7 is
// killed (its connection closed under it), and the time is taken from
// the kill to the first event the survivor folds in one of those
// partitions (first-ms) and to the last of them to fold its first event
// (all-ms).
//
//	go test ./store -run '^$' -bench GroupFailover -benchtime 3x
func BenchmarkGroupFailover(b *testing.B) {
	h := enginetest.Simulate(100_000, 1_000)
	var haves []*nats.Msg
	for _, m := range h.Msgs {
		if _, kind, _ := (events.Subjects{}).Parse(m.Subject); kind == events.KindHave {
			haves = append(haves, m)
		}
	}
	ttl := engine.DefaultLeaseTTL
	var firstSum, allSum time.Duration
	for i := range b.N {
		c, _, js, _, cfg := storetest.StartClusterStream(b, 3, store.StreamConfig{Replicas: 3})
		sealed(b, js, cfg, h).Load(b, js)
		preJoin(b, js, cfg, ttl, []string{"a", "b"})
		var killed atomic.Int64 // unix nanos of the kill
		var mu sync.Mutex
		first := map[int]time.Time{}
		var a *benchMember
		b1 := startBenchMember(b, c.Connect, cfg, "b", ttl, engine.Faults{AfterFold: func(p int, _ uint64) error {
			if p < 8 && killed.Load() != 0 {
				mu.Lock()
				if _, ok := first[p]; !ok {
					first[p] = time.Now()
				}
				mu.Unlock()
			}
			return nil
		}})
		a = startBenchMember(b, c.Connect, cfg, "a", ttl, engine.Faults{})
		snaps, err := store.OpenSnapshots(context.Background(), js, cfg)
		if err != nil {
			b.Fatal(err)
		}
		enginetest.WaitCheckpoints(b, snaps, enginetest.InputTargets(b, js, cfg), time.Now())
		if got := a.r.Owned(); !slices.Equal(got, []int{0, 1, 2, 3, 4, 5, 6, 7}) {
			b.Fatalf("a folds %v", got)
		}
		// Haves keep arriving on every partition.
		pctx, stopPub := context.WithCancel(context.Background())
		pubDone := make(chan struct{})
		go func() {
			defer close(pubDone)
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for i := 0; pctx.Err() == nil; i++ {
				<-tick.C
				m := haves[i%len(haves)]
				for range 2 {
					_, _ = js.PublishMsgAsync(&nats.Msg{Subject: m.Subject, Data: m.Data})
				}
			}
		}()
		// Let the flow settle, then kill a.
		deadline := time.Now().Add(ttl)
		for time.Now().Before(deadline) {
			if len(b1.r.Owned()) == 8 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond)
		k := time.Now()
		killed.Store(k.UnixNano())
		a.nc.Close()
		a.cancel()
		for {
			mu.Lock()
			n := len(first)
			mu.Unlock()
			if n == 8 {
				break
			}
			if time.Since(k) > 4*ttl {
				b.Fatalf("only %d of a's partitions folded by b after %v", n, time.Since(k))
			}
			time.Sleep(5 * time.Millisecond)
		}
		stopPub()
		<-pubDone
		var firstT, lastT time.Time
		for _, t := range first {
			if firstT.IsZero() || t.Before(firstT) {
				firstT = t
			}
			if t.After(lastT) {
				lastT = t
			}
		}
		firstSum += firstT.Sub(k)
		allSum += lastT.Sub(k)
		b.Logf("run %d: first event folded by the successor %v after the kill, every partition %v (TTL %v)", i, firstT.Sub(k), lastT.Sub(k), ttl)
		<-a.done
	}
	b.ReportMetric(float64(firstSum.Milliseconds())/float64(b.N), "first-ms")
	b.ReportMetric(float64(allSum.Milliseconds())/float64(b.N), "all-ms")
	b.ReportMetric(ttl.Seconds()*1000, "ttl-ms")
}
