package console

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
)

// fleetOnly is a Source whose Fleet answers nvs, err; nothing else of it
// is called by load without warnings.
type fleetOnly struct {
	Source
	nvs []NodeView
	err error
}

func (s fleetOnly) Fleet(context.Context) ([]NodeView, error) { return s.nvs, s.err }

// wallClock is a wall clock a test moves.
type wallClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *wallClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *wallClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestFleetPageNotFromAnOldIndex plays a fresh user's finding M7: a
// console started before any node existed (no snapshot yet: an empty
// fleet, shown once as "0 nodes"), then 60 nodes taken in live while
// nobody looked, then a page asked 25 minutes later. It answered from
// the index made at the first request, "0 nodes · Nothing needs an
// operator", "as of" the request's time. The page must be made of the
// fleet as it is: an index whose copy is indexMaxAge or more old is not
// shown.
func TestFleetPageNotFromAnOldIndex(t *testing.T) {
	t.Parallel()
	names := make([]string, 60)
	for i := range names {
		names[i] = fmt.Sprintf("n%02d", i+1)
	}
	s := reconciletest.Scripted(names, 1200, 7, nil)
	now := s.TimeOf(s.Next())
	const stale = 10 * time.Minute

	f := newFleet(fleetOnly{err: query.ErrNoSnapshots}, slog.New(slog.DiscardHandler))
	clock := &wallClock{t: time.Date(2026, 12, 5, 1, 16, 20, 0, time.UTC)}
	f.wall = clock.now
	if noSnaps, err := f.load(context.Background(), time.Time{}); err != nil || !noSnaps {
		t.Fatalf("load: %v, no snapshots %v; want none found", err, noSnaps)
	}
	if p := f.page(fleetQuery{Page: 1, NPage: 1}, now, stale); p.Nodes != 0 || p.Loading || p.Unread != "" || !p.NoSnapshots {
		t.Fatalf("before any node: %d nodes, loading %v, unread %q; want 0 nodes, loaded", p.Nodes, p.Loading, p.Unread)
	}

	// The nodes' views come in live (refresh) while no page is asked.
	want := 0
	f.mu.Lock()
	for _, n := range names {
		nv := NodeView{Node: n, View: s.State(n).View()}
		f.views[n] = nv
		if r := nv.Row(now, stale); len(r.Attention) > 0 {
			want++
		}
		f.changed()
	}
	gen := f.gen
	f.mu.Unlock()
	if want == 0 {
		t.Fatal("the script gave no node a need: the test would not tell an empty fleet apart")
	}

	clock.add(25 * time.Minute)
	p := f.page(fleetQuery{Page: 1, NPage: 1}, now.Add(25*time.Minute), stale)
	if p.Nodes != len(names) || p.NeedsTotal != want || p.Gen != gen {
		t.Errorf("25 min later: the page shows %d nodes, %d needing an operator, of generation %d; want %d, %d, %d (the fleet as it is)",
			p.Nodes, p.NeedsTotal, p.Gen, len(names), want, gen)
	}
}
