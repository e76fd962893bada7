package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/engine/enginetest"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// liveRuns is how many restarts BenchmarkRestartLive times a figure and
// a binary.
const liveRuns = 2

// BenchmarkRestartLive is how a user meets a `meshfold reconcile`
// restart at MESHFOLD_SCALE_NODES nodes (default 100,000), 20 events a
// node (enginetest.Simulate, sealed; one nats-server process, 16
// partitions, folded once untimed so that snapshots cover it): each
// restart is over a tail of 4,000 messages' haves published while no
// reconciler ran (as BenchmarkReconcileScale's restart-N), after the
// server's block cache expired, and
//
//   - want: once every partition's checkpoint past the tail is stored
//     (the end of the restart as issue 27's goal measures it), a want
//     with a new module is published for one node of each partition,
//     none named by any tail or by another restart's wants; reported:
//     the time from the publish to its plan (the plan's publish, heard
//     on its plain subject), the median and the slowest of the 16, and
//     from the process's start to the last plan.
//
//   - sigterm: at the same point, SIGTERM; reported: the time to the
//     process's exit.
//
// MESHFOLD_BENCH_PROFILES=DIR writes CPU profiles of the reconciler and
// the server from the checkpoint past the tail, while the wants wait
// (MESHFOLD_BENCH_PROFILE_SECONDS, default 5); the CPU either took from
// there to the last plan is logged in any case.
//
// Each figure is the median of liveRuns restarts. MESHFOLD_BENCH_BINS=
// PATH,PATH alternates binaries restart by restart (figures prefixed
// bin<i>-): before and after on one load.
//
//	go test ./cmd/meshfold -run '^$' -bench RestartLive -benchtime 1x -timeout 30m
func BenchmarkRestartLive(b *testing.B) {
	if testing.Short() {
		b.Skip("-short")
	}
	n := scaleNodes(b)
	bins := []string{""}
	if list := os.Getenv("MESHFOLD_BENCH_BINS"); list != "" {
		bins = strings.Split(list, ",")
	}
	s := startOutsideServer(b)
	t0 := time.Now()
	h := enginetest.Simulate(20*n, n)
	s.load(b, h)
	tails := tailsHaves(h, 2*liveRuns*len(bins))
	h = nil
	named := map[string]bool{}
	for _, tail := range tails {
		for _, m := range tail {
			if node, _, err := s.cfg.Subjects().Parse(m.Subject); err == nil {
				named[node] = true
			}
		}
	}
	// For each want restart, one node of each partition that no tail
	// names and no other restart's wants name (at small sizes, where the
	// tails name every node, any): its state is one the restart reads
	// after its tail, never one the tail read because the restart before
	// stopped before it folded its own plans back.
	runs := liveRuns * len(bins)
	byPart := map[int][]string{}
	for _, anyNode := range []bool{false, true} {
		for i := 0; i < n; i++ {
			node := enginetest.Node(i)
			if p := s.cfg.Subjects().Partition(node); len(byPart[p]) < runs && (anyNode || !named[node]) && !slices.Contains(byPart[p], node) {
				byPart[p] = append(byPart[p], node)
			}
		}
	}
	wantNodes := make([][]string, runs)
	for k := range wantNodes {
		for _, list := range byPart {
			wantNodes[k] = append(wantNodes[k], list[k%len(list)])
		}
	}
	if len(byPart) == 0 {
		b.Fatal("no node to publish wants for")
	}
	s.ensureFolded(b)
	b.Logf("%d nodes: %d messages generated, sealed, published and folded in %s", n, s.msgs, time.Since(t0).Round(time.Second))
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	prefix := func(i int) string {
		if len(bins) > 1 {
			return fmt.Sprintf("bin%d-", i+1)
		}
		return ""
	}
	next := 0 // the next tail
	b.Run("want", func(b *testing.B) {
		type figures struct{ median, slowest, fromStart []float64 }
		per := make([]figures, len(bins))
		for k := range liveRuns * len(bins) {
			i := k % len(bins)
			s.bin = bins[i]
			time.Sleep(cacheExpiry)
			p := s.liveRestart(b, tails[next])
			next++
			var profiled sync.WaitGroup
			if dir := os.Getenv("MESHFOLD_BENCH_PROFILES"); dir != "" {
				// From the checkpoint past the tail, while the wants
				// wait: the reconciler's and the server's CPU profiles.
				name := filepath.Join(dir, fmt.Sprintf("%s.%d", strings.ReplaceAll(b.Name(), "/", "_"), k+1))
				if bins[i] != "" {
					name += "." + filepath.Base(bins[i])
				}
				profiled.Go(func() { p.cpuProfile(name + ".cpu.pb.gz") })
				profiled.Go(func() { s.serverProfileFor(b, name+".server.cpu.pb.gz", time.Duration(profileSeconds())*time.Second) })
			}
			cpu0, srv0 := p.cpu(), s.srv.CPU()
			at := time.Now()
			took, fromStart := s.wantsDuring(b, p, wantNodes[k], fmt.Sprintf("probe:%d", k))
			window := time.Since(at)
			cpu, srv := p.cpu()-cpu0, s.srv.CPU()-srv0
			profiled.Wait()
			p.stop()
			s.bin = ""
			f := &per[i]
			f.median, f.slowest = append(f.median, median(took)), append(f.slowest, slices.Max(took))
			f.fromStart = append(f.fromStart, ms(fromStart))
			b.Logf("restart %d (%s): want → plan median %.0f ms, slowest %.0f ms; process start → last plan %.0f ms; "+
				"from the checkpoint to the last plan (%.0f ms) the reconciler took %.0f ms of CPU, the server %.0f ms",
				k+1, filepath.Base(bins[i]), median(took), slices.Max(took), ms(fromStart), ms(window), ms(cpu), ms(srv))
		}
		for i, f := range per {
			b.ReportMetric(median(f.median), prefix(i)+"want-plan-median-ms")
			b.ReportMetric(median(f.slowest), prefix(i)+"want-plan-slowest-ms")
			b.ReportMetric(median(f.fromStart), prefix(i)+"start-last-plan-ms")
		}
	})
	b.Run("sigterm", func(b *testing.B) {
		per := make([][]float64, len(bins))
		for k := range liveRuns * len(bins) {
			i := k % len(bins)
			s.bin = bins[i]
			time.Sleep(cacheExpiry)
			p := s.liveRestart(b, tails[next])
			next++
			at := time.Now()
			p.stop()
			took := ms(time.Since(at))
			s.bin = ""
			per[i] = append(per[i], took)
			b.Logf("restart %d (%s): SIGTERM → exit %.0f ms", k+1, filepath.Base(bins[i]), took)
		}
		for i, f := range per {
			b.ReportMetric(median(f), prefix(i)+"sigterm-exit-ms")
		}
	})
}

// liveRestart publishes tail, starts a reconcile process on the snapshots
// and returns it once every partition's checkpoint past the tail is
// stored (as the server's watch delivers it).
func (s *outsideServer) liveRestart(b *testing.B, tail []*nats.Msg) *benchProc {
	b.Helper()
	(&enginetest.History{Msgs: tail}).Load(b, s.js)
	s.refresh(b)
	stamps := s.watchCheckpoints(b)
	p := s.startProc(b, "--log-level", "debug")
	stamps(b)
	if !p.alive() {
		p.fail("exited (%v) during its restart", p.werr)
	}
	return p
}

// wantsDuring publishes a want of module build for each of nodes, at
// once, and waits (up to a minute) for each node's plan, heard on its
// plain plan subject: it returns each want's time from its publish to
// its plan, in milliseconds, and the time from p's start to the last
// plan.
func (s *outsideServer) wantsDuring(b *testing.B, p *benchProc, nodes []string, build string) ([]float64, time.Duration) {
	b.Helper()
	nc, _ := s.srv.Connect(b)
	defer nc.Close()
	plans := make(chan string, 4*len(nodes))
	for _, node := range nodes {
		node := node
		if _, err := nc.Subscribe(s.cfg.Subjects().Event(node, events.KindPlan), func(*nats.Msg) { plans <- node }); err != nil {
			b.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
	pub := store.NewPublisher(s.js, s.cfg.Subjects())
	sent := map[string]time.Time{}
	for _, node := range nodes {
		w := events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "probe", Build: build}}}, time.Now())
		sent[node] = time.Now()
		if _, err := pub.Append(context.Background(), node, w); err != nil {
			b.Fatal(err)
		}
	}
	var took []float64
	var last time.Time
	deadline := time.After(time.Minute)
	for len(sent) > 0 {
		select {
		case node := <-plans:
			at, ok := sent[node]
			if !ok {
				continue
			}
			delete(sent, node)
			now := time.Now()
			took = append(took, float64(now.Sub(at).Microseconds())/1000)
			last = now
		case <-deadline:
			p.fail("no plan a minute after the wants for %d nodes", len(sent))
		}
	}
	return took, last.Sub(p.start)
}
