package store_test

import (
	"bytes"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// BenchmarkScanSummaries reads 20,000 nodes' summaries (250 B each, in
// headers beside 2.9 kB states, as in BenchmarkFleetJSON100k's mix) in
// one pass: the client's and the in-process server's cost of the read
// fleet -o json starts with. cpu-ns/node is the process's CPU (user and
// system) a node: steadier than the time on a shared machine.
func BenchmarkScanSummaries(b *testing.B) {
	ctx := testCtx(b)
	_, _, js, _, cfg := storetest.StartStream(b, store.StreamConfig{})
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		b.Fatal(err)
	}
	const n = 20000
	state, sum := bytes.Repeat([]byte("s"), 2900), bytes.Repeat([]byte("u"), 250)
	byPart := map[int]map[string][]byte{}
	sums := map[string][]byte{}
	for i := range n {
		node := fmt.Sprintf("node-%05d", i)
		p := events.Partition(node, cfg.Partitions)
		if byPart[p] == nil {
			byPart[p] = map[string][]byte{}
		}
		byPart[p][node] = state
		sums[node] = sum
	}
	for p, states := range byPart {
		if err := snaps.PutSummarizedAt(ctx, p, states, sums, nil); err != nil {
			b.Fatal(err)
		}
	}
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b.ReportAllocs()
	c0 := cpu()
	for b.Loop() {
		got := 0
		bare, err := snaps.ScanSummaries(ctx, func(string, []byte) error {
			got++
			return nil
		})
		if err != nil || got != n || len(bare) != 0 {
			b.Fatalf("%d summaries, %d bare, %v", got, len(bare), err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/node")
	b.ReportMetric(float64((cpu()-c0).Nanoseconds())/float64(b.N*n), "cpu-ns/node")
}
