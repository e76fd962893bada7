package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/engine/enginetest"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// loadGen offers other nodes' traffic to a stream at a steady rate for a
// benchmark (BenchmarkKnockLatency's load, BenchmarkKnockLoadCeiling's
// ceiling), so that the rate reached is the system's and not the
// generator's: the messages are encoded once (the caller's), each
// connection publishes its share as core publishes with one reply
// subject for all of them (the server's stored acknowledgement comes back
// there; a handler counts it and looks for an error, no future, no
// decode), at most Window unacknowledged a connection, paced by credit
// (what the elapsed time owes, at most a second of it) rather than by a
// ticker (a late tick is lost, and the old loop waited for every pending
// ack each time it was behind, emptying the pipe).
//
// Mode "jsasync" is the former generator (jetstream PublishMsgAsync of
// Rate/100 messages each 10 ms tick, every pending ack awaited when more
// than two ticks' worth pend), on the first connection only: the before
// of the change, for an A/B in one binary.
type loadGen struct {
	// sent counts messages published, acked those the stream stored
	// (acknowledged without an error), failed acknowledgements with one.
	sent, acked, failed atomic.Int64
	done                chan struct{}
}

// loadGenConfig configures a loadGen.
type loadGenConfig struct {
	// Msgs are sent in turn, over and over, each connection starting at
	// its own index; their Reply is replaced (copies are sent).
	Msgs []*nats.Msg
	// Rate is the offered rate, events/s over all connections; 0: as
	// fast as Window lets (the ceiling).
	Rate int
	// Conns publish the load, Rate/len(Conns) each.
	Conns []*nats.Conn
	// Window bounds the unacknowledged messages a connection; default
	// 4,096.
	Window int
	// Mode is "core" (default) or "jsasync".
	Mode string
	// Hold, when set, pauses the "core" loops while it is true (see
	// holdAbove).
	Hold *atomic.Bool
}

// loadGenFromEnv reads the generator's knobs from the environment:
// MESHFOLD_KNOCK_GEN (mode, "core" or "jsasync"), MESHFOLD_KNOCK_CONNS
// (connections, default 1: one reached 47,500–70,000 events/s against a
// bare server where two reached 40,000–46,000) and MESHFOLD_KNOCK_WINDOW (unacknowledged a
// connection, default 4,096).
func loadGenFromEnv(tb testing.TB) (mode string, conns, window int) {
	mode = os.Getenv("MESHFOLD_KNOCK_GEN")
	if mode == "" {
		mode = "core"
	}
	if mode != "core" && mode != "jsasync" {
		tb.Fatalf("MESHFOLD_KNOCK_GEN=%q: core or jsasync", mode)
	}
	conns = envInt(tb, "MESHFOLD_KNOCK_CONNS", 1, 1, "a count ≥ 1")
	window = envInt(tb, "MESHFOLD_KNOCK_WINDOW", 4096, 1, "a count ≥ 1")
	return mode, conns, window
}

// envInt returns the environment variable name as an integer, def when
// it is unset; a value that is not an integer of at least least fails tb,
// saying what it should be.
func envInt(tb testing.TB, name string, def, least int, what string) int {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < least {
		tb.Fatalf("%s=%q: %s", name, v, what)
	}
	return n
}

// dialLoad opens n connections to url for a loadGen, closed at cleanup.
func dialLoad(tb testing.TB, url string, n int) []*nats.Conn {
	var conns []*nats.Conn
	for i := range n {
		nc, err := nats.Connect(url, nats.Name(fmt.Sprintf("knock-load-%d", i)))
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(nc.Close)
		conns = append(conns, nc)
	}
	return conns
}

// startLoadGen starts the load until ctx ends; Done closes when every
// connection's loop has returned. An error publishing fails tb.
func startLoadGen(ctx context.Context, tb testing.TB, cfg loadGenConfig) *loadGen {
	if cfg.Window == 0 {
		cfg.Window = 4096
	}
	g := &loadGen{done: make(chan struct{})}
	var wg sync.WaitGroup
	if cfg.Mode == "jsasync" {
		js, err := jetstream.New(cfg.Conns[0])
		if err != nil {
			tb.Fatal(err)
		}
		wg.Go(func() { g.jsAsync(ctx, tb, js, cfg) })
	} else {
		for c, nc := range cfg.Conns {
			wg.Go(func() { g.core(ctx, tb, nc, c, cfg) })
		}
	}
	go func() { wg.Wait(); close(g.done) }()
	return g
}

// core is one connection's loop of the "core" mode.
func (g *loadGen) core(ctx context.Context, tb testing.TB, nc *nats.Conn, c int, cfg loadGenConfig) {
	inbox := "_INBOX." + nuid.Next()
	var pending atomic.Int64
	room := make(chan struct{}, 1) // a signal: the window has room again
	errAck := []byte(`"error"`)
	sub, err := nc.Subscribe(inbox, func(m *nats.Msg) {
		if len(m.Data) == 0 || bytes.Contains(m.Data, errAck) { // a status (no stream) or an error
			g.failed.Add(1)
		} else {
			g.acked.Add(1)
		}
		if pending.Add(-1) == int64(cfg.Window/2) {
			select {
			case room <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		tb.Error(err)
		return
	}
	defer sub.Unsubscribe()
	// The acks of a window must not hit the subscription's pending
	// limits (a slow consumer would drop them and stall the loop).
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		tb.Error(err)
		return
	}
	msgs := make([]*nats.Msg, len(cfg.Msgs))
	for i, m := range cfg.Msgs {
		cp := *m
		cp.Reply, cp.Sub = inbox, nil
		if len(cp.Header) == 0 {
			cp.Header = nil // a plain PUB, no empty header block
		}
		msgs[i] = &cp
	}
	rate := float64(cfg.Rate) / float64(len(cfg.Conns))
	// A second of credit at most: a loop the scheduler left out for a
	// while (a loaded machine's time slices) makes up for it, within the
	// window, so that a rate below the offered one is the system's.
	burst := max(1, rate)
	i, owed, last := c, 0.0, time.Now()
	for ctx.Err() == nil {
		if cfg.Hold != nil && cfg.Hold.Load() {
			time.Sleep(time.Millisecond) // the system is behind: no credit meanwhile
			last = time.Now()
			continue
		}
		n := cfg.Window - int(pending.Load())
		if rate > 0 {
			now := time.Now()
			owed = min(owed+now.Sub(last).Seconds()*rate, burst)
			last = now
			n = min(n, int(owed))
		}
		if n <= 0 {
			if int(pending.Load()) >= cfg.Window {
				select { // the window is full: the system's pace
				case <-room:
				case <-ctx.Done():
				case <-time.After(10 * time.Millisecond):
				}
			} else {
				time.Sleep(time.Millisecond) // ahead of the offered pace
			}
			continue
		}
		for range n {
			pending.Add(1)
			if err := nc.PublishMsg(msgs[i%len(msgs)]); err != nil {
				if ctx.Err() == nil {
					tb.Error(err)
				}
				return
			}
			i += len(cfg.Conns)
		}
		g.sent.Add(int64(n))
		owed -= float64(n)
	}
}

// jsAsync is the former generator (mode "jsasync").
func (g *loadGen) jsAsync(ctx context.Context, tb testing.TB, js jetstream.JetStream, cfg loadGenConfig) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	per := max(1, cfg.Rate/100)
	if cfg.Rate == 0 {
		per = cfg.Window / 2
	}
	haves := cfg.Msgs
	for i := 0; ctx.Err() == nil; {
		<-tick.C
		for range per {
			_, err := js.PublishMsgAsync(haves[i%len(haves)])
			for errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				select {
				case <-js.PublishAsyncComplete():
				case <-ctx.Done():
					return
				}
				_, err = js.PublishMsgAsync(haves[i%len(haves)])
			}
			if err != nil {
				if ctx.Err() == nil {
					tb.Error(err)
				}
				return
			}
			i++
		}
		g.sent.Add(int64(per))
		if js.PublishAsyncPending() > 2*per {
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				return
			}
		}
		// Acked: what no longer pends (errors are not told apart here).
		g.acked.Store(g.sent.Load() - int64(js.PublishAsyncPending()))
	}
}

// knockHaves are the haves of an enginetest.Simulate history over nodes
// nodes (20 events a node, at least 60,000): the knock benchmark's load,
// encoded once.
func knockHaves(nodes int) []*nats.Msg {
	h := enginetest.Simulate(max(60_000, 20*nodes), nodes)
	var haves []*nats.Msg
	for _, m := range h.Msgs {
		if _, kind, _ := (events.Subjects{}).Parse(m.Subject); kind == events.KindHave {
			haves = append(haves, m)
		}
	}
	return haves
}

// BenchmarkKnockLoadCeiling is BenchmarkKnockLatency's load generator
// alone against a bare server (a fresh stream, no reconciler, no probe):
// the rate it reaches, offered 50,000 events/s (`offered-50000`) and as
// fast as its window lets (`unpaced`), over MESHFOLD_KNOCK_SECONDS
// (default 10) after a second's warm-up, and the CPU an event stored of
// the benchmark's process (the generator's) and of the server's (a
// nats-server process, storetest.StartProcServer). Then the same load
// with a reconciler folding it, as BenchmarkKnockLatency runs them (one
// process, the server embedded, the load over loopback TCP), without the
// probes (`fold-offered-50000`, `fold-unpaced`), the load held while
// the reconciler is behind (holdAbove): the rate stored, the rate folded
// (the reconciler's meshfold_events_folded_total), its backlog at the
// end, and the process's CPU an event folded; the
// timing starts once the reconciler has folded a have of every node;
// with MESHFOLD_KNOCK_SERVER=proc the server of these is a nats-server
// process too, and its CPU an event folded is reported apart. The
// generator's knobs are loadGenFromEnv's; MESHFOLD_KNOCK_NODES sets the
// nodes of the haves (default 1,000). MESHFOLD_KNOCK_CASES=a,b runs only
// those cases. MESHFOLD_BENCH_PROFILES=DIR writes CPU profiles of the
// timed window (profileWindow): this process's, and the server's when it
// is a process of its own.
//
//	go test ./engine -run '^$' -bench KnockLoadCeiling -benchtime 1x
func BenchmarkKnockLoadCeiling(b *testing.B) {
	nodes := envInt(b, "MESHFOLD_KNOCK_NODES", 1_000, 1, "a count of nodes")
	secs := envInt(b, "MESHFOLD_KNOCK_SECONDS", 10, 1, "seconds ≥ 1")
	var only []string
	if v := os.Getenv("MESHFOLD_KNOCK_CASES"); v != "" {
		only = strings.Split(v, ",")
	}
	mode, nconns, window := loadGenFromEnv(b)
	haves := knockHaves(nodes)
	for _, c := range []struct {
		offered int
		fold    bool
	}{{knockLoad, false}, {0, false}, {knockLoad, true}, {0, true}} {
		name := fmt.Sprintf("offered-%d", c.offered)
		if c.offered == 0 {
			name = "unpaced"
		}
		if c.fold {
			name = "fold-" + name
		}
		if only != nil && !slices.Contains(only, name) {
			continue
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				var url string
				serverCPU := func() time.Duration { return 0 }
				var serverProfile func(time.Duration) ([]byte, error)
				var reg *prometheus.Registry
				bucketSeq := func() uint64 { return 0 }
				stopped := make(chan error, 1)
				if c.fold {
					var js jetstream.JetStream
					if os.Getenv("MESHFOLD_KNOCK_SERVER") == "proc" {
						s := storetest.StartProcServer(b)
						_, js = s.Connect(b)
						url, serverCPU, serverProfile = s.URL(), s.CPU, s.CPUProfile
					} else {
						e, _, j := storetest.Start(b)
						url, js = e.ClientURL(), j
					}
					_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
					if err != nil {
						b.Fatal(err)
					}
					reg = prometheus.NewRegistry()
					rc := engine.ReconcilerConfig{Stream: cfg, Signer: benchSigner(b), Metrics: engine.NewMetrics(reg)}
					rc.SnapshotEvery = envInt(b, "MESHFOLD_KNOCK_SNAPSHOT_EVERY", 0, 0, "events ≥ 0 (0: the default)")
					if v := os.Getenv("MESHFOLD_KNOCK_SNAPSHOT_INTERVAL"); v != "" {
						if rc.SnapshotInterval, err = time.ParseDuration(v); err != nil {
							b.Fatal(err)
						}
					}
					r, err := engine.NewReconciler(ctx, js, rc)
					if err != nil {
						b.Fatal(err)
					}
					bucketSeq = func() uint64 {
						st, err := js.Stream(ctx, "KV_"+cfg.Name+store.SnapshotBucketSuffix)
						if err != nil {
							return 0 // no checkpoint yet
						}
						return st.CachedInfo().State.LastSeq
					}
					go func() { stopped <- r.Run(ctx) }()
				} else {
					s := storetest.StartProcServer(b)
					_, js := s.Connect(b)
					url, serverCPU = s.URL(), s.CPU
					if _, _, err := store.EnsureStream(ctx, js, store.StreamConfig{}); err != nil {
						b.Fatal(err)
					}
					close(stopped)
				}
				folded := func() float64 {
					if reg == nil {
						return 0
					}
					return gathered(b, reg)[foldedName]
				}
				gctx, stopLoad := context.WithCancel(ctx)
				var hold *atomic.Bool
				watch := func(*loadGen) {}
				if c.fold {
					hold, watch = holdAbove(gctx, b, reg, folded())
				}
				g := startLoadGen(gctx, b, loadGenConfig{Msgs: haves, Rate: c.offered, Conns: dialLoad(b, url, nconns), Window: window, Mode: mode, Hold: hold})
				watch(g)
				time.Sleep(time.Second) // warm-up: the timing below is the steady rate
				for deadline := time.Now().Add(5 * time.Minute); c.fold && folded() < float64(min(len(haves), 2*nodes)); time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) {
						b.Fatalf("the reconciler folded %.0f haves in 5 minutes, want %d", folded(), 2*nodes)
					}
				}
				t0, a0, s0, f0, c0, sc0, p0 := time.Now(), g.acked.Load(), g.sent.Load(), folded(), cpuTime(b), serverCPU(), bucketSeq()
				profiled := profileWindow(b, serverProfile, time.Duration(secs)*time.Second)
				time.Sleep(time.Duration(secs) * time.Second)
				profiled()
				took, acked, sent, fold := time.Since(t0), g.acked.Load()-a0, g.sent.Load()-s0, folded()-f0
				cpu, scpu, puts := cpuTime(b)-c0, serverCPU()-sc0, bucketSeq()-p0
				var backlog float64
				if reg != nil {
					backlog = gathered(b, reg)[lagName]
				}
				stopLoad()
				<-g.done
				cancel()
				<-stopped
				if f := g.failed.Load(); f > 0 {
					b.Fatalf("%d publishes failed", f)
				}
				b.ReportMetric(float64(sent)/took.Seconds(), "sent-events/s")
				b.ReportMetric(float64(acked)/took.Seconds(), "stored-events/s")
				if c.fold {
					b.ReportMetric(fold/took.Seconds(), "fold-events/s")
					b.ReportMetric(backlog, "backlog-events")
					b.ReportMetric(float64(cpu.Nanoseconds())/fold, "process-cpu-ns/folded")
					b.ReportMetric(float64(puts)/fold, "puts/folded")
					if scpu > 0 {
						b.ReportMetric(float64(scpu.Nanoseconds())/fold, "server-cpu-ns/folded")
					}
				} else {
					b.ReportMetric(float64(cpu.Nanoseconds())/float64(acked), "gen-cpu-ns/event")
					b.ReportMetric(float64(scpu.Nanoseconds())/float64(acked), "server-cpu-ns/event")
				}
			}
		})
	}
}

// profileWindow, with MESHFOLD_BENCH_PROFILES=DIR, starts a CPU profile
// of this process (the reconciler, the load and, unless serverProfile is
// set, the server) and of the server process (serverProfile, when set)
// over the next d, written to DIR as <benchmark>.cpu.pb.gz and
// <benchmark>.server.cpu.pb.gz; the function returned waits for both.
// Without the variable it does nothing.
func profileWindow(b *testing.B, serverProfile func(time.Duration) ([]byte, error), d time.Duration) func() {
	dir := os.Getenv("MESHFOLD_BENCH_PROFILES")
	if dir == "" {
		return func() {}
	}
	name := filepath.Join(dir, strings.ReplaceAll(b.Name(), "/", "_"))
	f, err := os.Create(name + ".cpu.pb.gz")
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	if serverProfile != nil {
		wg.Go(func() {
			prof, err := serverProfile(d)
			if err == nil {
				err = os.WriteFile(name+".server.cpu.pb.gz", prof, 0o644)
			}
			if err != nil {
				b.Logf("no server profile: %v", err)
			}
		})
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		wg.Wait()
	}
}

// holdAbove holds g's load while the reconciler whose metrics reg
// gathers has more than most of its events unfolded (the events g stored
// since folded0, the reconciler's meshfold_events_folded_total then, less
// those it has folded since), looking every 5 ms until ctx ends: the rate
// reached is then the rate the reconciler sustains, and a probe's event
// waits behind at most about most others (at saturation, most over the
// rate folded: 5,000 at the 3,500–4,400 events/s a loaded 2-core machine
// folds at 100,000 nodes held every knock over a second; hence 1,000).
// MESHFOLD_KNOCK_BACKLOG sets most (default 1,000; 0: no hold).
func holdAbove(ctx context.Context, tb testing.TB, reg *prometheus.Registry, folded0 float64) (*atomic.Bool, func(*loadGen)) {
	most := envInt(tb, "MESHFOLD_KNOCK_BACKLOG", 1_000, 0, "events ≥ 0")
	hold := new(atomic.Bool)
	watch := func(g *loadGen) {
		if most == 0 {
			return
		}
		go func() {
			t := time.NewTicker(5 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				mfs, err := reg.Gather()
				if err != nil {
					continue
				}
				var folded float64
				for _, mf := range mfs {
					if mf.GetName() == foldedName {
						for _, m := range mf.GetMetric() {
							folded += m.GetCounter().GetValue()
						}
					}
				}
				hold.Store(float64(g.acked.Load())-(folded-folded0) > float64(most))
			}
		}()
	}
	return hold, watch
}

// knockRate is the load's offered rate, events/s: knockLoad, or
// MESHFOLD_KNOCK_RATE (to measure the knock at the rate the machine's
// reconciler and server sustain, BenchmarkKnockLoadCeiling's fold-*).
func knockRate(tb testing.TB) int {
	return envInt(tb, "MESHFOLD_KNOCK_RATE", knockLoad, 1, "events/s ≥ 1")
}

// gathered sums each metric family of reg's counters and gauges: a
// reconciler's meshfold_events_folded_total (events folded so far, every
// kind) and meshfold_partition_lag_messages (its partitions' messages
// stored and not yet folded, when it last looked).
func gathered(tb testing.TB, reg *prometheus.Registry) map[string]float64 {
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			out[mf.GetName()] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return out
}

// The metrics gathered reads.
const foldedName, lagName = "meshfold_events_folded_total", "meshfold_partition_lag_messages"
