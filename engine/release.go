package engine

import (
	"context"
	"runtime"
	"runtime/debug"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// heapRelease returns to the operating system the heap that partitions'
// loads freed, once no partition of the process is still loading
// (issue 27). A partition's start is a one-off burst: every snapshot of
// the partition is read and decoded, and the tail since its checkpoint
// refolded, which leaves behind several times the garbage of the states
// it keeps. Go's collector frees that garbage but keeps the pages: its
// scavenger returns only what exceeds the next collection's goal (twice
// the live heap with GOGC=100) by a tenth, so after a load nearly every
// freed page stayed resident, about half the live heap (1.8 KB of RSS a
// node beside 3.5 KB of live heap at 100,000 nodes). debug.FreeOSMemory
// collects and returns every free page; it is called once per burst, not
// per partition, since a full collection of a large heap costs CPU. The
// heap a live fold then grows up to the collector's goal is the
// operator's to bound (GOMEMLIMIT, docs/operations.md).
//
// While a partition folds the stream from its start (a cold refold: no
// checkpoint, a stream with messages), the collector's percent (GOGC) is
// loadGC times the process's own (unless collection is off), and set
// back when the last such partition ends: a refold's live heap only
// grows, so each collection marks more of it, and at 10,000 nodes and
// more marking was a fifth of a cold refold's CPU against a fifteenth at
// 1,000 (issue 27, the cost per node of a refold). A limit set with
// GOMEMLIMIT still bounds the heap. A partition that loads its states
// from snapshots does not raise it: raised there, the heap left after
// the load was more fragmented (in-use spans about twice the live heap),
// and RSS at 100,000 nodes rose from 5,289 / 5,449 to 5,860 / 6,495 B a
// node, over issue 27's 6 KiB (BenchmarkReconcileLoad100k, alternated,
// load average 6-8).
type heapRelease struct {
	mu      sync.Mutex
	loading int  // partitions between begin and end
	running bool // a release is under way
	again   bool // a burst ended while it ran
	release func()
	done    prometheus.Counter
	// gc raises the collector's percent while a cold refold lasts: the
	// process's (processGC), shared by every Reconciler of the process.
	gc *gcRaise
}

// gcRaise is the collector's percent raised by loadGC while any cold
// refold lasts. GOGC is the process's: one count serves every Reconciler in it
// (each raising and lowering it on its own, two whose loads overlapped
// left it raised, the second taking the first's raised percent for the
// process's).
type gcRaise struct {
	mu sync.Mutex
	n  int // raising loads under way
	// setGC sets the collector's percent and returns the previous one
	// (debug.SetGCPercent); own is the process's percent while a load
	// raised it.
	setGC func(int) int
	own   int
}

// processGC is the process's gcRaise.
var processGC = &gcRaise{setGC: debug.SetGCPercent}

// loadGC multiplies the collector's percent while partitions load: with
// GOGC=100, a load's heap grows to four times its live heap before a
// collection rather than twice.
const loadGC = 3

func newHeapRelease(done prometheus.Counter) *heapRelease {
	return &heapRelease{release: debug.FreeOSMemory, done: done, gc: processGC}
}

// begin marks a partition's load as started; raise says the load is a
// cold refold, which raises the collector's percent until it ends. The
// returned end marks it over; calls after the first do nothing. When the
// last partition loading ends, the release runs in a goroutine of its
// own (the caller does not wait for the collection).
func (h *heapRelease) begin(raise bool) (end func()) {
	h.mu.Lock()
	h.loading++
	if raise {
		h.gc.raise()
	}
	h.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if raise {
				h.gc.lower()
			}
			h.loading--
			if h.loading > 0 {
				return
			}
			if h.running {
				h.again = true
				return
			}
			h.running = true
			go h.run()
		})
	}
}

// raise multiplies the collector's percent by loadGC while any raising
// load of the process lasts; a collector turned off (GOGC=off) stays
// off. A nil g does nothing.
func (g *gcRaise) raise() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n++; g.n > 1 {
		return // raised by another load of the process
	}
	g.own = g.setGC(100 * loadGC)
	switch {
	case g.own < 0:
		g.setGC(g.own)
	case g.own != 100:
		g.setGC(g.own * loadGC)
	}
}

// lower sets the collector's percent back once the last raising load of
// the process is over.
func (g *gcRaise) lower() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n--; g.n == 0 {
		g.setGC(g.own)
	}
}

// run releases until no burst ended during the last release.
func (h *heapRelease) run() {
	for {
		h.release()
		h.done.Inc()
		h.mu.Lock()
		if !h.again || h.loading > 0 {
			h.again, h.running = false, false
			h.mu.Unlock()
			return
		}
		h.again = false
		h.mu.Unlock()
	}
}

// tailGate holds the pass over every state of a lazy session (see
// partition.shortTail) until no lazy session of the process is still
// refolding its tail: the pass reads and decodes thousands of states, and
// run beside the other partitions' tails it took the CPU they needed (a
// restart at 100,000 nodes took 3.5 s to checkpoint past its tail with
// each partition's pass starting at its own end of tail).
type tailGate struct {
	mu   sync.Mutex
	n    int           // lazy sessions refolding their tail
	open chan struct{} // closed while n is 0
}

func newTailGate() *tailGate {
	g := &tailGate{open: make(chan struct{})}
	close(g.open)
	return g
}

// begin counts a lazy session's tail; the returned end, called once or
// more, uncounts it.
func (g *tailGate) begin() (end func()) {
	g.mu.Lock()
	if g.n == 0 {
		g.open = make(chan struct{})
	}
	g.n++
	g.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.n--; g.n == 0 {
				close(g.open)
			}
		})
	}
}

// wait returns once no tail is counted, or with ctx's error.
func (g *tailGate) wait(ctx context.Context) error {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// restPasses is the number of restart passes that read states at once
// (ReconcilerConfig.RestPasses): n when set, else half of GOMAXPROCS, at
// least 1. Sixteen passes at once on 2 cores kept every partition's want
// waiting up to 11 s for its session and 3 s for a read by key, lost
// every tail consumer's heartbeat and had the server close the connection
// (issue 27): the passes' states fill the one connection the fold's messages and
// replies share, and their decoding took most of the process's CPU.
func restPasses(n int) int {
	if n > 0 {
		return n
	}
	return max(1, runtime.GOMAXPROCS(0)/2)
}

// firstLoads holds the agent liveness sweep (agentWatch.startSweep) until the
// partitions Run starts at once have each ended their first load (the
// session's endLoad: its states read and its tail refolded), so that the
// sweep's stream info, which walks every subject of the stream on the
// server (O(subjects): 60 ms of the server's CPU at 100,000 nodes), does
// not compete with a restart's refold of its tail (issue 27). With
// grants (a group) nothing is held: they arrive over time.
type firstLoads struct {
	mu      sync.Mutex
	n       int           // partitions registered whose first load has not ended
	started bool          // Run has registered every partition it starts at once
	done    chan struct{} // closed once started and n is 0
}

func newFirstLoads() *firstLoads { return &firstLoads{done: make(chan struct{})} }

// add registers a partition's first load; the returned end, called once
// or more, marks it over.
func (f *firstLoads) add() (end func()) {
	f.mu.Lock()
	f.n++
	f.mu.Unlock()
	return sync.OnceFunc(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.n--
		f.check()
	})
}

// start marks every partition of the start registered: once their loads
// end (at once, if none is registered), wait returns.
func (f *firstLoads) start() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.started {
		f.started = true
		f.check()
	}
}

// check closes done once started with no load left; f.mu held.
func (f *firstLoads) check() {
	if f.started && f.n == 0 {
		select {
		case <-f.done:
		default:
			close(f.done)
		}
	}
}

// wait returns once the first loads are over, or with ctx's error.
func (f *firstLoads) wait(ctx context.Context) error {
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
