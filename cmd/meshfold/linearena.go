package main

import (
	"sync"
	"unsafe"
)

// lineArena holds the JSON lines of `fleet -o json` until they are
// sorted and written, in slabs mapped apart from Go's heap with huge
// pages asked for where the kernel gives them on request (Linux), so
// that the lines fault in 2 MiB at a time instead of 4 KiB (issue 27).
// Where a slab cannot be mapped it hands out heap slices. Safe for
// concurrent use. free unmaps the slabs: no slice alloc returned may be
// used after.
type lineArena struct {
	mu    sync.Mutex
	slabs [][]byte // mapped, unmapped by free
	cur   []byte   // the newest slab
	off   int      // cur[off:] is not handed out yet
	heap  bool     // a mapping failed: the heap from then on
}

// arenaSlab is the size of each slab: address space, backed as it is
// written.
const arenaSlab = 64 << 20

// alloc returns an empty slice of capacity n.
func (a *lineArena) alloc(n int) []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.heap || n > arenaSlab/4 {
		return make([]byte, 0, n)
	}
	if a.off+n > len(a.cur) {
		s, err := mapSlab(arenaSlab)
		if err != nil {
			a.heap = true
			return make([]byte, 0, n)
		}
		a.slabs = append(a.slabs, s)
		a.cur, a.off = s, 0
	}
	b := a.cur[a.off : a.off : a.off+n]
	a.off += n
	return b
}

// trim gives back the capacity of b past its length when b is the last
// slice alloc returned and was not grown elsewhere; otherwise it does
// nothing.
func (a *lineArena) trim(b []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	start := a.off - cap(b)
	if cap(b) == 0 || start < 0 || unsafe.SliceData(b) != unsafe.SliceData(a.cur[start:]) {
		return
	}
	a.off = start + len(b)
}

// free unmaps every slab.
func (a *lineArena) free() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.slabs {
		unmapSlab(s)
	}
	a.slabs, a.cur, a.off = nil, nil, 0
}
