package main

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
)

// The arena's slices hold what is written to them, apart from each
// other, whether trimmed, grown past their capacity (then moved to the
// heap by append) or handed out from several goroutines, across slabs.
func TestLineArena(t *testing.T) {
	t.Parallel()
	var a lineArena
	defer a.free()
	const workers, each = 4, 4000
	got := make([][][]byte, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				b := a.alloc(8 << 10)
				line := fmt.Sprintf("%d:%d;", w, i)
				for len(b)+len(line) <= 5<<10 {
					b = append(b, line...)
				}
				if i%50 == 0 {
					b = append(b, bytes.Repeat([]byte("x"), 9<<10)...) // past its capacity
				}
				a.trim(b)
				got[w] = append(got[w], b)
			}
		})
	}
	wg.Wait()
	if len(a.slabs) < 2 {
		t.Errorf("%d slabs: the test did not cross one", len(a.slabs))
	}
	for w := range workers {
		for i, b := range got[w] {
			line := fmt.Sprintf("%d:%d;", w, i)
			want := bytes.Repeat([]byte(line), (5<<10)/len(line))
			if i%50 == 0 {
				want = append(want, bytes.Repeat([]byte("x"), 9<<10)...)
			}
			if !bytes.Equal(b, want) {
				t.Fatalf("worker %d line %d: %d bytes, not what was written", w, i, len(b))
			}
		}
	}
	// A slice larger than a quarter slab comes from the heap.
	if b := a.alloc(arenaSlab/4 + 1); cap(b) != arenaSlab/4+1 || len(b) != 0 {
		t.Errorf("large alloc: len %d cap %d", len(b), cap(b))
	}
}
