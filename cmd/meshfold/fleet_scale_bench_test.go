package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/testproc"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
	"github.com/meshfold/meshfold/store"
)

// scaleNodes is how many nodes the scale benchmarks store: 100,000 unless
// MESHFOLD_SCALE_NODES says otherwise.
func scaleNodes(b *testing.B) int {
	n := 100000
	if s := os.Getenv("MESHFOLD_SCALE_NODES"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			b.Fatalf("MESHFOLD_SCALE_NODES=%q: a count of nodes", s)
		}
		n = v
	}
	return n
}

// scaleStates returns n snapshots as the reconciler stores them: the
// states of 1,000 nodes of the bench's mix (reconciletest.Scripted, 20
// inputs a node), each used for n/1,000 nodes under its own name.
func scaleStates(b testing.TB, n int) map[string][]byte {
	b.Helper()
	states, _ := scaleSnapshots(b, n, false)
	return states
}

// scaleSnapshots is scaleStates with, when summaries, each state's fleet
// summary (reconcile.MarshalSummary), as the reconciler puts them
// (store.Snapshots.PutSummarizedAt).
func scaleSnapshots(b testing.TB, n int, summaries bool) (map[string][]byte, map[string][]byte) {
	b.Helper()
	const distinct = 1000
	names := make([]string, distinct)
	for i := range names {
		names[i] = fmt.Sprintf("t%04d", i)
	}
	s := reconciletest.Scripted(names, 20*distinct, 17, nil)
	states := make([]*reconcile.State, distinct)
	for i, name := range names {
		states[i] = s.State(name)
	}
	out := make(map[string][]byte, n)
	sums := make(map[string][]byte, n)
	for i := range n {
		st := *states[i%distinct]
		st.Node = fmt.Sprintf("node-%06d", i)
		data, err := reconcile.MarshalState(&st)
		if err != nil {
			b.Fatal(err)
		}
		out[st.Node] = data
		if summaries {
			if sums[st.Node], err = reconcile.MarshalSummary(&st); err != nil {
				b.Fatal(err)
			}
		}
	}
	return out, sums
}

// BenchmarkFleetJSON100k compares `meshfold fleet -o json --all` over 100,000
// nodes (MESHFOLD_SCALE_NODES) — the whole command as its own process:
// connect, read every node's summary (or snapshot), decode, make, sort
// and print every row — with a raw read of every snapshot key of the same
// bucket (values not decoded) on the same server (issue 27, item 2: goal
// ≤ 1.5×), the faster of a KV watch of node.> and an ordered pull
// consumer of the keys' last values. The stream holds no event: the
// journal warnings' read finds nothing to count. It reports each in ms
// (medians of three alternated runs), the ratio, the CPU each took (the
// server's and the reader's, user and system: steadier than wall time on
// a shared machine), the fleet process's peak RSS, and the bytes read and
// printed; then runs the table
// (`meshfold fleet`) once and checks it is a page, its summary first.
func BenchmarkFleetJSON100k(b *testing.B) {
	if testing.Short() {
		b.Skip("-short")
	}
	n := scaleNodes(b)
	m := startMesh(b)
	ctx := context.Background()
	snaps, err := store.OpenSnapshots(ctx, m.js, m.cfg)
	if err != nil {
		b.Fatal(err)
	}
	// As the reconciler stores them: each state with its summary, unless
	// MESHFOLD_FLEET_BARE=1 (as a build that wrote none left them: every
	// row read from its state).
	bare := os.Getenv("MESHFOLD_FLEET_BARE") == "1"
	byPart := map[int]map[string][]byte{}
	var stored int
	all, sums := scaleSnapshots(b, n, !bare)
	for node, data := range all {
		p := events.Partition(node, m.cfg.Partitions)
		if byPart[p] == nil {
			byPart[p] = map[string][]byte{}
		}
		byPart[p][node] = data
		stored += len(data)
	}
	for p, states := range byPart {
		if err := snaps.PutSummarizedAt(ctx, p, states, sums, nil); err != nil {
			b.Fatal(err)
		}
	}
	bucket := snaps.Bucket()

	// CPU: this process's (the server's, and the raw reader's) and the
	// fleet process's, user and system: on a machine others load too, the
	// wall times swing with them, the CPU spent much less.
	selfCPU := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	var rawCPU, pullCPU, fleetCPU []time.Duration
	var fleetProcCPU []time.Duration // the fleet process's alone (user+system)
	var fleetProcSys []time.Duration // of which system
	var fleetRSS []int64             // the fleet process's peak RSS (VmHWM) as last read, bytes
	// raw reads every snapshot key's latest value, not decoded, the way a
	// user reads a bucket: a KV watch (the client's ordered push
	// consumer). pull reads the same with an ordered pull consumer on the
	// bucket's stream, asking for the last message of each node key. The
	// faster of the two is the baseline.
	raw := func() (time.Duration, int) {
		c0 := selfCPU()
		defer func() { rawCPU = append(rawCPU, selfCPU()-c0) }()
		t0 := time.Now()
		nc, err := nats.Connect(m.e.ClientURL(), nats.Name("raw-read"))
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			b.Fatal(err)
		}
		w, err := kv.Watch(ctx, "node.>", jetstream.IgnoreDeletes())
		if err != nil {
			b.Fatal(err)
		}
		defer w.Stop()
		keys, bytes := 0, 0
		for e := range w.Updates() {
			if e == nil {
				break
			}
			keys++
			bytes += len(e.Value())
		}
		if keys != n {
			b.Fatalf("raw read: %d keys, want %d", keys, n)
		}
		return time.Since(t0), bytes
	}
	pull := func() time.Duration {
		c0 := selfCPU()
		defer func() { pullCPU = append(pullCPU, selfCPU()-c0) }()
		t0 := time.Now()
		nc, err := nats.Connect(m.e.ClientURL(), nats.Name("raw-pull"))
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		cons, err := js.OrderedConsumer(ctx, "KV_"+bucket, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{"$KV." + bucket + ".node.>"},
			DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		})
		if err != nil {
			b.Fatal(err)
		}
		it, err := cons.Messages(jetstream.PullMaxMessages(1024))
		if err != nil {
			b.Fatal(err)
		}
		defer it.Stop()
		keys := 0
		for keys < n {
			msg, err := it.Next()
			if err != nil {
				b.Fatalf("raw pull: after %d keys: %v", keys, err)
			}
			keys++
			_ = msg.Data()
		}
		return time.Since(t0)
	}
	childProfile := "" // MESHFOLD_HELPER_PROFILE of the fleet process
	// MESHFOLD_BENCH_BINS=PATH,PATH,…: the fleet runs use each of these
	// meshfold binaries in turn (builds to compare, alternated in each
	// round against the same bucket and the same raw reads), each with
	// its own figures; without it, this test binary's fleet.
	var bins []string
	if list := os.Getenv("MESHFOLD_BENCH_BINS"); list != "" {
		bins = strings.Split(list, ",")
	}
	// MESHFOLD_FLEET_DUMP=FILE: the first fleet run's output is written
	// to FILE too (to compare two builds' outputs); with bins, each
	// binary's first to FILE.binN.
	dumps := map[string]io.Writer{}
	if name := os.Getenv("MESHFOLD_FLEET_DUMP"); name != "" {
		for i, bin := range append([]string{""}, bins...) {
			file := name
			if bin != "" {
				file = fmt.Sprintf("%s.bin%d", name, i-1)
			}
			f, err := os.Create(file)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			dumps[bin] = f
		}
	}
	fleetCmd := func(bin string, args ...string) *exec.Cmd {
		if bin == "" {
			cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestHelperProcess$", "--"}, args...)...)
			cmd.Env = append(os.Environ(), "MESHFOLD_HELPER_PROCESS=1")
			return cmd
		}
		return exec.Command(bin, args...)
	}
	fleet := func(bin string) (time.Duration, int) {
		// Counted as it comes, as a pipe to a file or jq would take it:
		// a buffer growing to 91 MB cost this process 0.27 s of CPU,
		// counted against fleet.
		var out lineCounter
		if d := dumps[bin]; d != nil {
			out.dump = d
			delete(dumps, bin)
		}
		var errb bytes.Buffer
		cmd := fleetCmd(bin, "fleet", "-o", "json", "--all", "--server", m.e.ClientURL())
		if childProfile != "" {
			cmd.Env = append(cmd.Env, "MESHFOLD_HELPER_PROFILE="+childProfile)
		}
		cmd.Stdout, cmd.Stderr = &out, &errb
		c0 := selfCPU()
		t0 := time.Now()
		if err := testproc.StartChild(cmd); err != nil {
			b.Fatal(err)
		}
		// The fleet process's peak RSS, its VmHWM read every 20 ms until
		// it exits (wait4's maxrss is this process's: os/exec's clone
		// shares our memory until the exec).
		hwm := make(chan int64)
		stop := make(chan struct{})
		go func() {
			var peak int64
			status := fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)
			for {
				if data, err := os.ReadFile(status); err == nil {
					for l := range strings.Lines(string(data)) {
						if rest, ok := strings.CutPrefix(l, "VmHWM:"); ok {
							if kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64); err == nil {
								peak = max(peak, kb<<10)
							}
						}
					}
				}
				select {
				case <-stop:
					hwm <- peak
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
		err := cmd.Wait()
		d := time.Since(t0)
		close(stop)
		peak := <-hwm
		if cmd.ProcessState != nil {
			proc := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
			fleetCPU = append(fleetCPU, selfCPU()-c0+proc)
			fleetProcCPU = append(fleetProcCPU, proc)
			fleetProcSys = append(fleetProcSys, cmd.ProcessState.SystemTime())
			fleetRSS = append(fleetRSS, peak)
		}
		if err != nil {
			b.Fatalf("fleet -o json: %v\n%s", err, errb.String())
		}
		if out.lines != n {
			b.Fatalf("fleet -o json printed %d lines, want %d", out.lines, n)
		}
		return d, out.bytes
	}
	raw()
	pull()
	fleet("") // warm: the server's pages, the binary
	for _, bin := range bins {
		fleet(bin)
	}
	rawCPU, pullCPU, fleetCPU, fleetProcCPU, fleetProcSys, fleetRSS = nil, nil, nil, nil, nil, nil
	var rawT, pullT, fleetT []time.Duration
	var rawB, outB int
	// With bins: each binary's runs (wall, CPU, the process's CPU),
	// taken from the slices above as they are appended.
	type binRuns struct{ wall, cpu, proc, sys []time.Duration }
	byBin := make([]binRuns, len(bins))
	rounds := 3
	if s := os.Getenv("MESHFOLD_FLEET_ROUNDS"); s != "" {
		if rounds, err = strconv.Atoi(s); err != nil || rounds < 1 {
			b.Fatalf("MESHFOLD_FLEET_ROUNDS=%q: a count of rounds", s)
		}
	}
	for b.Loop() {
		for round := range rounds {
			d, nb := raw()
			rawT, rawB = append(rawT, d), nb
			pullT = append(pullT, pull())
			if len(bins) == 0 {
				d, nb = fleet("")
				fleetT, outB = append(fleetT, d), nb
				continue
			}
			// Each round starts with the next binary: none always
			// runs first after the raw reads.
			for k := range bins {
				i := (round + k) % len(bins)
				d, nb = fleet(bins[i])
				outB = nb
				br := &byBin[i]
				br.wall = append(br.wall, d)
				br.cpu = append(br.cpu, fleetCPU[len(fleetCPU)-1])
				br.proc = append(br.proc, fleetProcCPU[len(fleetProcCPU)-1])
				br.sys = append(br.sys, fleetProcSys[len(fleetProcSys)-1])
			}
		}
	}
	med := func(ds []time.Duration) time.Duration {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	if len(bins) > 0 {
		r, p := med(rawT), med(pullT)
		baseCPU := min(med(rawCPU), med(pullCPU))
		b.ReportMetric(float64(n), "nodes")
		b.ReportMetric(ms(min(r, p)), "raw-ms")
		b.ReportMetric(ms(baseCPU), "raw-cpu-ms")
		for i, bin := range bins {
			br := byBin[i]
			f, fc := med(br.wall), med(br.cpu)
			b.ReportMetric(float64(f)/float64(min(r, p)), fmt.Sprintf("fleet/raw-bin%d", i))
			b.ReportMetric(float64(fc)/float64(baseCPU), fmt.Sprintf("fleet/raw-cpu-bin%d", i))
			b.ReportMetric(ms(med(br.proc)), fmt.Sprintf("fleet-proc-cpu-ms-bin%d", i))
			b.Logf("bin%d %s: fleet -o json %s (%.2f× the faster raw read), CPU %s (%.2f× the lower), the process's own %s (system %s); runs wall %v cpu %v proc %v",
				i, bin, f.Round(time.Millisecond), float64(f)/float64(min(r, p)), fc.Round(time.Millisecond), float64(fc)/float64(baseCPU),
				med(br.proc).Round(time.Millisecond), med(br.sys).Round(time.Millisecond), br.wall, br.cpu, br.proc)
		}
		b.Logf("raw reads: watch %s / pull %s, CPU %s / %s; runs watch %v pull %v, CPU %v %v; json %.1f B/node",
			r.Round(time.Millisecond), p.Round(time.Millisecond), med(rawCPU).Round(time.Millisecond), med(pullCPU).Round(time.Millisecond),
			rawT, pullT, rawCPU, pullCPU, float64(outB)/float64(n))
		return
	}
	r, p, f := med(rawT), med(pullT), med(fleetT)
	base := min(r, p) // the faster raw read
	b.ReportMetric(float64(n), "nodes")
	b.ReportMetric(ms(r), "raw-read-ms")
	b.ReportMetric(ms(p), "raw-pull-ms")
	b.ReportMetric(ms(f), "fleet-json-ms")
	b.ReportMetric(float64(f)/float64(base), "fleet/raw")
	rc, pc, fc := med(rawCPU), med(pullCPU), med(fleetCPU)
	baseCPU := min(rc, pc)
	b.ReportMetric(ms(rc), "raw-read-cpu-ms")
	b.ReportMetric(ms(pc), "raw-pull-cpu-ms")
	b.ReportMetric(ms(fc), "fleet-json-cpu-ms")
	b.ReportMetric(float64(fc)/float64(baseCPU), "fleet/raw-cpu")
	// Of fleet's CPU, the fleet process's own (the rest is the server's,
	// and this process reading fleet's output).
	b.ReportMetric(ms(med(fleetProcCPU)), "fleet-proc-cpu-ms")
	b.ReportMetric(float64(slices.Max(fleetRSS))/(1<<20), "fleet-max-rss-MB")
	b.ReportMetric(float64(rawB)/float64(n), "snapshot-B/node")
	b.ReportMetric(float64(outB)/float64(n), "json-B/node")
	what := "with a summary each"
	if bare {
		what = "none with a summary (MESHFOLD_FLEET_BARE)"
	}
	b.Logf("%d nodes (%d MB of snapshots, %s): raw read of every key: watch %s, ordered pull %s; fleet -o json %s (%.2f× the faster raw read; goal ≤ 1.5×); runs watch %v pull %v fleet %v",
		n, stored>>20, what, r.Round(time.Millisecond), p.Round(time.Millisecond), f.Round(time.Millisecond), float64(f)/float64(base), rawT, pullT, fleetT)
	b.Logf("CPU (server and reader, user+system): raw read: watch %s, ordered pull %s; fleet -o json %s (%.2f× the lower); runs watch %v pull %v fleet %v (the fleet process's own %v, of which system %v)",
		rc.Round(time.Millisecond), pc.Round(time.Millisecond), fc.Round(time.Millisecond), float64(fc)/float64(baseCPU), rawCPU, pullCPU, fleetCPU, fleetProcCPU, fleetProcSys)

	// The table: what needs an operator first, one page, not a line a
	// node.
	{
		var out, errb bytes.Buffer
		cmd := fleetCmd("", "fleet", "--server", m.e.ClientURL())
		cmd.Stdout, cmd.Stderr = &out, &errb
		t0 := time.Now()
		if err := testproc.StartChild(cmd); err != nil {
			b.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			b.Fatalf("fleet: %v\n%s", err, errb.String())
		}
		d := time.Since(t0)
		lines := strings.Split(out.String(), "\n")
		// A page of 50 rows, and the lines after the table for those rows
		// only (a crash loop's files, each failed apply, …).
		if len(lines) > 2000 || !strings.HasPrefix(out.String(), "NEEDS") || !strings.Contains(out.String(), "-- page 1 of ") {
			b.Fatalf("fleet's table at %d nodes: %d lines:\n%s", n, len(lines), out.String())
		}
		var tail []string
		for _, l := range lines {
			if strings.HasPrefix(l, "-- ") {
				tail = append(tail, l)
			}
		}
		b.Logf("fleet (the table) in %s, %d lines, %d bytes; its first lines and its -- lines:\n%s\n…\n%s", d.Round(time.Millisecond), len(lines)-1, out.Len(),
			strings.Join(lines[:min(len(lines), 16)], "\n"), strings.Join(tail, "\n"))
	}

	// MESHFOLD_FLEET_PROFILE=DIR: one more run of each, after the
	// measured ones, profiled: DIR/raw.cpu (this process: the server and
	// the raw reader), DIR/fleet-server.cpu (this process during the
	// fleet run: the server), DIR/fleet.cpu and DIR/fleet.heap (the
	// fleet process; the heap profile's alloc_space is what it allocated).
	if dir := os.Getenv("MESHFOLD_FLEET_PROFILE"); dir != "" {
		profile := func(name string, run func()) {
			f, err := os.Create(filepath.Join(dir, name))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				b.Fatal(err)
			}
			run()
			pprof.StopCPUProfile()
		}
		profile("raw.cpu", func() { raw() })
		childProfile = filepath.Join(dir, "fleet")
		profile("fleet-server.cpu", func() { fleet("") })
		b.Logf("profiles in %s", dir)
	}
}

// lineCounter counts the bytes and lines written to it, and copies them
// to dump when set.
type lineCounter struct {
	bytes, lines int
	dump         io.Writer
}

func (c *lineCounter) Write(p []byte) (int, error) {
	c.bytes += len(p)
	c.lines += bytes.Count(p, []byte("\n"))
	if c.dump != nil {
		return c.dump.Write(p)
	}
	return len(p), nil
}
