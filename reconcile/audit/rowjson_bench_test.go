package audit_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
)

// BenchmarkFleetRowAppendJSON encodes the fleet rows of 1,000 nodes of
// the bench's mix (reconciletest.Scripted, 20 inputs a node: the rows
// `meshfold fleet -o json` prints in BenchmarkFleetJSON100k), a row an
// op.
func BenchmarkFleetRowAppendJSON(b *testing.B) {
	const n = 1000
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("t%04d", i)
	}
	s := reconciletest.Scripted(names, 20*n, 17, nil)
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	rows := make([]audit.FleetRow, n)
	size := 0
	for i, name := range names {
		rows[i] = audit.FleetRowOf(s.State(name), now, 10*time.Minute)
		rows[i].SetWarnings(0)
		j, err := rows[i].AppendJSON(nil)
		if err != nil {
			b.Fatal(err)
		}
		size += len(j)
	}
	buf := make([]byte, 0, 64<<10)
	b.SetBytes(int64(size / n))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		var err error
		if buf, err = rows[i%n].AppendJSON(buf[:0]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
