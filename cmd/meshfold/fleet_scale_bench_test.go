package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
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
	for i := range n {
		st := *states[i%distinct]
		st.Node = fmt.Sprintf("node-%06d", i)
		data, err := reconcile.MarshalState(&st)
		if err != nil {
			b.Fatal(err)
		}
		out[st.Node] = data
	}
	return out
}

// BenchmarkFleetJSON100k compares `meshfold fleet -o json --all` over 100,000
// nodes (MESHFOLD_SCALE_NODES) — the whole command as its own process:
// connect, read every snapshot, decode, make, sort and print every row —
// with a raw read of every snapshot key of the same bucket (one KV watch
// of node.>, values not decoded) on the same server (issue 27, item 2:
// goal ≤ 1.5×). The stream holds no event: the journal warnings' read
// finds nothing to count. It reports each in ms (medians of three
// alternated runs), the ratio, the CPU each took (the server's and the
// reader's, user and system: steadier than wall time on a shared
// machine), and the bytes read and printed.
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
	byPart := map[int]map[string][]byte{}
	var stored int
	for node, data := range scaleStates(b, n) {
		p := events.Partition(node, m.cfg.Partitions)
		if byPart[p] == nil {
			byPart[p] = map[string][]byte{}
		}
		byPart[p][node] = data
		stored += len(data)
	}
	for p, states := range byPart {
		if err := snaps.PutNodes(ctx, p, states); err != nil {
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
	var rawCPU, fleetCPU []time.Duration
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
	fleet := func() (time.Duration, int) {
		var out, errb bytes.Buffer
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "--", "fleet", "-o", "json", "--all", "--server", m.e.ClientURL())
		cmd.Env = append(os.Environ(), "MESHFOLD_HELPER_PROCESS=1")
		cmd.Stdout, cmd.Stderr = &out, &errb
		c0 := selfCPU()
		t0 := time.Now()
		if err := testproc.StartChild(cmd); err != nil {
			b.Fatal(err)
		}
		err := cmd.Wait()
		d := time.Since(t0)
		if cmd.ProcessState != nil {
			fleetCPU = append(fleetCPU, selfCPU()-c0+cmd.ProcessState.UserTime()+cmd.ProcessState.SystemTime())
		}
		if err != nil {
			b.Fatalf("fleet -o json: %v\n%s", err, errb.String())
		}
		if lines := bytes.Count(out.Bytes(), []byte("\n")); lines != n {
			b.Fatalf("fleet -o json printed %d lines, want %d", lines, n)
		}
		return d, out.Len()
	}
	raw()
	fleet() // warm: the server's pages, the binary
	rawCPU, fleetCPU = nil, nil
	var rawT, fleetT []time.Duration
	var rawB, outB int
	for b.Loop() {
		for range 3 {
			d, nb := raw()
			rawT, rawB = append(rawT, d), nb
			d, nb = fleet()
			fleetT, outB = append(fleetT, d), nb
		}
	}
	med := func(ds []time.Duration) time.Duration {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	r, f := med(rawT), med(fleetT)
	b.ReportMetric(float64(n), "nodes")
	b.ReportMetric(ms(r), "raw-read-ms")
	b.ReportMetric(ms(f), "fleet-json-ms")
	b.ReportMetric(float64(f)/float64(r), "fleet/raw")
	rc, fc := med(rawCPU), med(fleetCPU)
	b.ReportMetric(ms(rc), "raw-read-cpu-ms")
	b.ReportMetric(ms(fc), "fleet-json-cpu-ms")
	b.ReportMetric(float64(fc)/float64(rc), "fleet/raw-cpu")
	b.ReportMetric(float64(rawB)/float64(n), "snapshot-B/node")
	b.ReportMetric(float64(outB)/float64(n), "json-B/node")
	b.Logf("%d nodes (%d MB of snapshots): raw read of every key %s, fleet -o json %s (%.2f× the raw read; goal ≤ 1.5×); runs raw %v fleet %v",
		n, stored>>20, r.Round(time.Millisecond), f.Round(time.Millisecond), float64(f)/float64(r), rawT, fleetT)
	b.Logf("CPU (server and reader, user+system): raw read %s, fleet -o json %s (%.2f×); runs raw %v fleet %v",
		rc.Round(time.Millisecond), fc.Round(time.Millisecond), float64(fc)/float64(rc), rawCPU, fleetCPU)
}
