package main

import (
	"os"
	"testing"
	"time"

	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
)

// BenchmarkFleetLines is the fleet process's own work of `fleet -o json`
// past the read, on one goroutine: 20,000 summaries of the bench's mix
// (BenchmarkFleetJSON100k's) decoded, made into rows, annotated (no
// warnings, no source problems, as that bench has), encoded and keyed in
// batches of 256, then sorted and written to /dev/null. Per node.
func BenchmarkFleetLines(b *testing.B) {
	const n = 20000
	_, sums := scaleSnapshots(b, n, true)
	var data [][]byte
	for _, s := range sums {
		data = append(data, s)
	}
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer null.Close()
	now := time.Now()
	seqs := map[string][]uint64{}
	annotate := func(row *audit.FleetRow) { row.SetWarningSeqs(seqs[row.Node]) }
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		var arena lineArena
		var chunks []*fleetJSONChunk
		rows := make([]audit.FleetRow, 0, 256)
		for i, d := range data {
			v, err := reconcile.UnmarshalSummary(d)
			if err != nil {
				b.Fatal(err)
			}
			rows = append(rows, query.NodeView{Node: v.Node, View: v}.Row(now, 10*time.Minute))
			if len(rows) == 256 || i == len(data)-1 {
				chunks = append(chunks, encodeFleetChunk(&arena, rows, annotate, true))
				rows = rows[:0]
			}
		}
		if err := writeFleetChunks(null, chunks); err != nil {
			b.Fatal(err)
		}
		arena.free()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/node")
}
