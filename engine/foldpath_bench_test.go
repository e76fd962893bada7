package engine

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine/enginetest"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// BenchmarkFoldPath is a cold refold's work in the reconciler's own code,
// without NATS: for each message of a [enginetest.Simulate] history of 20
// events a node, in order, what session.fold does (the subject parsed,
// the payload decoded through the partition's interner, its strings and
// lists interned, the node's state looked up or made, the event folded
// and a new plan's rows shared, the node marked dirty), then, per
// partition, what the final checkpoint encodes (each dirty node's
// snapshot and summary). 16 partitions, each
// with its own interner, states and dirty nodes, as a reconcile process
// holds them; the collector at the percent a cold refold raises it to.
// At 1,000, 10,000 and 100,000 nodes (MESHFOLD_SCALE_NODES the largest):
// what of the per-event cost grows with the nodes, apart from the
// server and the network (issue 27, a cold refold's cost per node).
//
//	go test ./engine -run '^$' -bench FoldPath -benchtime 1x
func BenchmarkFoldPath(b *testing.B) {
	top := 100_000
	if s := os.Getenv("MESHFOLD_SCALE_NODES"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			b.Fatalf("MESHFOLD_SCALE_NODES=%q: a count of nodes", s)
		}
		top = v
	}
	sizes := []int{1_000, 10_000, top}
	slices.Sort(sizes)
	sizes = slices.Compact(slices.DeleteFunc(sizes, func(n int) bool { return n > top }))
	for _, n := range sizes {
		b.Run(fmt.Sprintf("nodes-%d", n), func(b *testing.B) {
			path := writeHistory(b, enginetest.Simulate(20*n, n))
			for range b.N {
				foldPath(b, path, n)
			}
		})
	}
}

// BenchmarkFoldPathDense is BenchmarkFoldPath over the effect-dense mix
// of BenchmarkCatchUpMixes (enginetest.SimulateDense, 300,000 events over
// 3,000 nodes, about a quarter of them plans and journal entries, every
// plan read and folded as a first refold reads back its own): the
// reconciler's share of the dense first refold apart from publishing,
// the server and the network (issue 27, item 1). fold-cpu-ns/event is
// the process's CPU over the fold (its collector's included), the figure
// a loaded machine cannot move much.
//
//	go test ./engine -run '^$' -bench FoldPathDense -benchtime 1x
func BenchmarkFoldPathDense(b *testing.B) {
	const nodes = 3_000
	path := writeHistory(b, enginetest.SimulateDense(100*nodes, nodes))
	for range b.N {
		foldPath(b, path, nodes)
	}
}

// writeHistory writes h's messages to a file, each its subject and its
// payload with their lengths, and returns its path: read back message by
// message, the history takes no part of the heap the collector paces by.
func writeHistory(b *testing.B, h *enginetest.History) string {
	path := filepath.Join(b.TempDir(), "history")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for _, m := range h.Msgs {
		w.Write(binary.AppendUvarint(nil, uint64(len(m.Subject))))
		w.WriteString(m.Subject)
		w.Write(binary.AppendUvarint(nil, uint64(len(m.Data))))
		w.Write(m.Data)
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	return path
}

func foldPath(b *testing.B, path string, nodes int) {
	const parts = 16
	type part struct {
		in     *interner
		states map[string]*reconcile.State
		dirty  map[string]dirtyNode
	}
	var ps [parts]*part
	for i := range ps {
		ps[i] = &part{in: newInterner(), states: map[string]*reconcile.State{}, dirty: map[string]dirtyNode{}}
	}
	subj := events.Subjects{}
	runtime.GC()
	old := debug.SetGCPercent(foldPathGC(b))
	defer debug.SetGCPercent(old)
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	b.ResetTimer()
	cpu0 := processCPU(b)
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<16)
	// next reads the next message as the client hands it over: a subject
	// and a payload of their own.
	next := func() (string, []byte, bool) {
		n, err := binary.ReadUvarint(r)
		if err != nil {
			return "", nil, false
		}
		sb := make([]byte, n)
		io.ReadFull(r, sb)
		n, _ = binary.ReadUvarint(r)
		data := make([]byte, n)
		io.ReadFull(r, data)
		return string(sb), data, true
	}
	peak := watchPeakHeap()
	gc0 := gcCPU()
	t0 := time.Now()
	folded, msgs := 0, 0
	for i := 0; ; i++ {
		s, data, ok := next()
		if !ok {
			break
		}
		msgs++
		node, kind, err := subj.Parse(s)
		if err != nil || !kind.Input() {
			continue
		}
		p := ps[events.Partition(node, parts)]
		ev := events.Event{Seq: uint64(i + 1), Node: node, Kind: kind}
		ev.Payload, ev.Err = p.in.dec.Decode(kind, data)
		if ev.Payload != nil {
			p.in.read(ev.Payload)
		}
		st := p.states[node]
		if st == nil {
			st = reconcile.NewState(node)
			p.states[node] = st
		}
		p.in.folded(st, st.Fold(ev))
		if d, ok := p.dirty[node]; ok {
			d.st = st
			p.dirty[node] = d
		} else {
			p.dirty[node] = dirtyNode{st: st, first: ev.Seq}
		}
		folded++
	}
	fold := time.Since(t0)
	foldCPU := processCPU(b) - cpu0
	gcFoldCPU := gcCPU() - gc0
	peakHeap := peak()
	runtime.ReadMemStats(&ms1)
	gcFold := ms1.NumGC - ms0.NumGC
	t1 := time.Now()
	var bytes int
	for _, p := range ps {
		arena := stateArena{left: len(p.dirty)}
		for _, d := range p.dirty {
			buf := arena.room()
			start := len(buf)
			grown, err := reconcile.AppendState(buf, d.st)
			if err != nil {
				b.Fatal(err)
			}
			arena.took(grown)
			sum, err := reconcile.MarshalSummary(d.st)
			if err != nil {
				b.Fatal(err)
			}
			bytes += len(grown) - start + len(sum)
		}
	}
	encode := time.Since(t1)
	b.StopTimer()
	runtime.GC()
	var ms2 runtime.MemStats
	runtime.ReadMemStats(&ms2)
	b.ReportMetric(float64(ms2.HeapObjects-ms0.HeapObjects)/float64(nodes), "live-objects/node")
	b.ReportMetric(float64(ms2.HeapAlloc-ms0.HeapAlloc)/float64(nodes), "live-B/node")
	runtime.KeepAlive(ps)
	b.ReportMetric(float64(fold.Nanoseconds())/float64(folded), "fold-ns/event")
	b.ReportMetric(float64(foldCPU.Nanoseconds())/float64(folded), "fold-cpu-ns/event")
	b.ReportMetric(float64(encode.Nanoseconds())/float64(nodes), "encode-ns/node")
	b.ReportMetric(float64(fold.Nanoseconds()+encode.Nanoseconds())/float64(msgs), "ns/message")
	b.ReportMetric(float64(gcFold), "gcs")
	b.ReportMetric(gcFoldCPU*1e9/float64(folded), "gc-cpu-ns/event")
	b.ReportMetric(float64(bytes)/float64(nodes), "snapshot-B/node")
	b.ReportMetric(float64(ms1.TotalAlloc-ms0.TotalAlloc)/float64(folded), "alloc-B/event")
	b.ReportMetric(float64(ms1.PauseTotalNs-ms0.PauseTotalNs)/float64(folded), "gc-pause-ns/event")
	// The largest heap the fold reached (its objects, sampled every
	// 5 ms), a node: the memory a cold refold's collector percent costs.
	b.ReportMetric(float64(peakHeap-ms0.HeapAlloc)/float64(nodes), "peak-heap-B/node")
}

// processCPU is the CPU this process has used (user and system, every
// thread: the fold's goroutine and the collector's workers).
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// foldPathGC is the collector's percent BenchmarkFoldPath folds at: a
// cold refold's (loadGC times the default 100), or MESHFOLD_FOLDPATH_GOGC.
func foldPathGC(b *testing.B) int {
	s := os.Getenv("MESHFOLD_FOLDPATH_GOGC")
	if s == "" {
		return loadGC * 100
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		b.Fatalf("MESHFOLD_FOLDPATH_GOGC=%q: a percent", s)
	}
	return v
}

// watchPeakHeap samples the heap's objects (runtime/metrics, no stop of
// the world) every 5 ms until the returned function is called, which
// returns the largest sample in bytes.
func watchPeakHeap() func() uint64 {
	done, out := make(chan struct{}), make(chan uint64)
	go func() {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		var peak uint64
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			peak = max(peak, s[0].Value.Uint64())
			select {
			case <-done:
				out <- peak
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 { close(done); return <-out }
}

// gcCPU is the CPU seconds the collector has taken so far (an estimate
// of the runtime's, runtime/metrics).
func gcCPU() float64 {
	s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	metrics.Read(s)
	return s[0].Value.Float64()
}
