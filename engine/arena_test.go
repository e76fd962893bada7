package engine

import (
	"bytes"
	"runtime"
	"testing"
)

// TestStateArenaAllocation: a checkpoint's states encoded through a
// stateArena take about the bytes they hold, also at a session's first
// checkpoint (no average yet), and each keeps its own bytes while later
// ones are appended. One buffer grown by append for all of them allocated
// about five times their bytes (issue 27).
func TestStateArenaAllocation(t *testing.T) {
	// Not parallel: it measures the process's TotalAlloc.
	const n, size = 20_000, 2_300 // a cold refold's partition at 320,000 nodes, states of ~2.3 KB
	state := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, size+i%50) }
	for _, avg := range []int{0, size} {
		var ms0, ms1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms0)
		a := stateArena{avg: avg, left: n}
		out := make([][]byte, n)
		held := 0
		for i := range n {
			buf := a.room()
			start := len(buf)
			grown := append(buf, state(i)...)
			out[i] = grown[start:len(grown):len(grown)]
			a.took(grown)
			held += len(out[i])
		}
		runtime.ReadMemStats(&ms1)
		// The states themselves (state(i), made here) are as many bytes
		// again: the arena may take at most a fifth more than held.
		if got, limit := ms1.TotalAlloc-ms0.TotalAlloc, uint64(2*held+held/5+arenaChunk); got > limit {
			t.Errorf("avg %d: %d states of %d bytes in all allocated %d bytes, want at most %d", avg, n, held, got, limit)
		}
		for i := range n {
			if !bytes.Equal(out[i], state(i)) {
				t.Fatalf("avg %d: state %d changed after later appends", avg, i)
			}
		}
	}
}
