package engine

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meshfold/meshfold/internal/waitfor"
)

// TestHeapReleaseOncePerBurst: the heap is released once the last of
// the partitions loading together ends, not once per partition; an end
// called twice counts once; a burst that ends while a release runs gets
// a release of its own after it.
func TestHeapReleaseOncePerBurst(t *testing.T) {
	t.Parallel()
	released := make(chan struct{})
	proceed := make(chan struct{})
	done := prometheus.NewCounter(prometheus.CounterOpts{Name: "releases"})
	h := newHeapRelease(done)
	h.release = func() {
		released <- struct{}{}
		<-proceed
	}
	wait := func(what string) {
		t.Helper()
		select {
		case <-released:
		case <-time.After(10 * time.Second):
			t.Fatalf("no release %s", what)
		}
	}
	none := func(what string) {
		t.Helper()
		select {
		case <-released:
			t.Fatalf("a release %s", what)
		default:
		}
	}

	a, b := h.begin(false), h.begin(false)
	a()
	a()
	none("while a partition still loads")
	b()
	wait("when the last partition loading ended")
	// A second burst begins and ends while the first release runs.
	c := h.begin(false)
	c()
	none("while another runs")
	proceed <- struct{}{}
	wait("for the burst that ended while the first ran")
	proceed <- struct{}{}
	waitfor.Until(t, 10*time.Second, "two releases counted", func() bool { return testutil.ToFloat64(done) == 2 })
	none("more than once per burst")
}

// TestHeapReleaseRaisesGCWhileLoading: the collector's percent is
// loadGC times the process's from the first cold refold's start to the
// last's end, then the process's again; a collector turned off stays
// off; a load from snapshots (begin(false)) leaves it as it is, even
// when it outlasts the cold refolds.
func TestHeapReleaseRaisesGCWhileLoading(t *testing.T) {
	t.Parallel()
	for _, own := range []int{100, 50, -1} {
		percent := own
		h := newHeapRelease(prometheus.NewCounter(prometheus.CounterOpts{Name: "releases"}))
		released := make(chan struct{}, 2)
		h.release = func() { released <- struct{}{} }
		h.gc = &gcRaise{setGC: func(p int) int { prev := percent; percent = p; return prev }}
		want := own * loadGC
		if own < 0 {
			want = own
		}
		snap := h.begin(false)
		if percent != own {
			t.Fatalf("GOGC %d: %d while a partition loads from snapshots, want it as it was", own, percent)
		}
		a := h.begin(true)
		if percent != want {
			t.Fatalf("GOGC %d: %d while a partition refolds cold, want %d", own, percent, want)
		}
		b := h.begin(true)
		a()
		if percent != want {
			t.Fatalf("GOGC %d: %d while a second partition still refolds cold, want %d", own, percent, want)
		}
		b()
		if percent != own {
			t.Fatalf("GOGC %d: %d after the cold refolds, want it back", own, percent)
		}
		snap()
		select {
		case <-released:
		case <-time.After(10 * time.Second):
			t.Fatalf("GOGC %d: no release after the burst", own)
		}
	}
}

// TestTailGate: the gate opens once every tail counted has ended (an end
// called twice counts once), and a wait ends with its context.
func TestTailGate(t *testing.T) {
	t.Parallel()
	g := newTailGate()
	if err := g.wait(context.Background()); err != nil {
		t.Fatalf("wait with no tail: %v", err)
	}
	a, b := g.begin(), g.begin()
	a()
	a()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.wait(ctx); err == nil {
		t.Fatal("the gate opened with a tail still counted")
	}
	opened := make(chan error, 1)
	go func() { opened <- g.wait(context.Background()) }()
	b()
	select {
	case err := <-opened:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the gate did not open once every tail ended")
	}
}

// TestHeapReleaseGCOfTwoReconcilers: GOGC is the process's, and two
// reconcilers of one process (a group's instances in a test, a program
// embedding two) whose loads overlap set it back to the process's own
// once both have ended: each raising and lowering it on its own, the
// second took the first's raised percent for the process's and left it
// raised (300 for 100) for the rest of the process.
func TestHeapReleaseGCOfTwoReconcilers(t *testing.T) {
	t.Parallel()
	percent := 100
	gc := &gcRaise{setGC: func(p int) int { prev := percent; percent = p; return prev }}
	hs := make([]*heapRelease, 2)
	for i := range hs {
		hs[i] = newHeapRelease(prometheus.NewCounter(prometheus.CounterOpts{Name: "releases"}))
		hs[i].release = func() {}
		hs[i].gc = gc // the process's, shared
	}
	a := hs[0].begin(true)
	b := hs[1].begin(true)
	if percent != 100*loadGC {
		t.Fatalf("GOGC %d while both load, want %d", percent, 100*loadGC)
	}
	a()
	if percent != 100*loadGC {
		t.Fatalf("GOGC %d while the second still loads, want %d", percent, 100*loadGC)
	}
	b()
	if percent != 100 {
		t.Fatalf("GOGC %d once both loads ended, want the process's 100", percent)
	}
}
