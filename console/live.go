package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile/audit"
)

// fleet is the console's picture of every node: the views loaded from
// the snapshots at start, each replaced by the reconciler's live view
// once an event of the node folds. Rows are made from views with
// audit.FleetRowOfView at render time, so ages are always told against
// the present.
type fleet struct {
	src Source
	log *slog.Logger

	mu       sync.Mutex
	views    map[string]NodeView
	warnings map[string]int
	// dirty maps a node to the newest sequence of it seen on the stream
	// that its view does not cover yet.
	dirty map[string]uint64
	// last maps a node to the newest sequence of it seen on the stream
	// since the console started following.
	last map[string]uint64
	gen  uint64
	subs map[chan struct{}]struct{}
	wake chan struct{}
	// sources are the provisioners' reports of unfilled files, per node
	// (pollSources).
	sources map[string][]audit.SourceProblem
}

func newFleet(src Source, log *slog.Logger) *fleet {
	return &fleet{src: src, log: log, views: map[string]NodeView{}, warnings: map[string]int{},
		dirty: map[string]uint64{}, last: map[string]uint64{}, subs: map[chan struct{}]struct{}{}, wake: make(chan struct{}, 1)}
}

// load reads every snapshot and the journal warnings since since.
func (f *fleet) load(ctx context.Context, since time.Time) error {
	nvs, err := f.src.Fleet(ctx)
	if errors.Is(err, query.ErrNoSnapshots) {
		nvs, err = nil, nil // no reconciler checkpointed yet: an empty fleet
	}
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	var counts map[string]int
	if !since.IsZero() {
		if counts, err = f.src.Warnings(ctx, since); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, nv := range nvs {
		// A live view already taken in is newer than the snapshot.
		if old, ok := f.views[nv.Node]; !ok || old.View.Seq < nv.View.Seq {
			f.views[nv.Node] = nv
		}
	}
	for n, c := range counts {
		f.warnings[n] += c
	}
	f.changed()
	return nil
}

// saw records an event from the stream: its node's view is refreshed
// from the reconciler once it has folded it.
func (f *fleet) saw(ev events.Event) {
	f.mu.Lock()
	if ev.Kind == events.KindJournal {
		if j, ok := ev.Payload.(*events.Journal); ok && j.Level != events.LevelInfo {
			f.warnings[ev.Node]++
		}
	}
	f.dirty[ev.Node] = max(f.dirty[ev.Node], ev.Seq)
	f.last[ev.Node] = max(f.last[ev.Node], ev.Seq)
	f.notify() // node pages: a newer event, before it folds
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// refreshRetry is how long a node whose event the reconciler has not
// folded yet waits before it is asked again.
const refreshRetry = 50 * time.Millisecond

// refreshMaxRetry bounds the wait between two asks while the reconciler
// makes no progress (down, or not folding).
const refreshMaxRetry = 5 * time.Second

// refresh asks the reconciler for the view of every dirty node until ctx
// is done. A node stays dirty until the view covers the newest event seen
// of it; with no reconciler answering, it keeps its last view.
func (f *fleet) refresh(ctx context.Context) {
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	delay := refreshRetry
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
		case <-retry.C:
		}
		f.mu.Lock()
		dirty := maps.Clone(f.dirty)
		f.mu.Unlock()
		again, progress := false, false
		for node, seq := range dirty {
			v, _, err := f.src.Live(ctx, node)
			switch {
			case errors.Is(err, query.ErrNoReconciler):
				again = true
				continue
			case errors.Is(err, query.ErrUnknownNode):
				again = true // not folded yet
				continue
			case err != nil:
				if ctx.Err() != nil {
					return
				}
				f.log.Warn("console: live view", "node", node, "err", err)
				again = true
				continue
			}
			f.mu.Lock()
			if old, ok := f.views[node]; !ok || old.View.Seq < v.Seq || old.Err != nil {
				f.views[node] = NodeView{Node: node, View: v}
				f.changed()
				progress = true
			}
			if v.Seq >= seq && f.dirty[node] == seq {
				delete(f.dirty, node)
			} else {
				again = true
			}
			f.mu.Unlock()
		}
		// A reconciler that lags is asked again soon; one that is down or
		// stuck, less and less often (up to refreshMaxRetry).
		if progress {
			delay = refreshRetry
		} else if again {
			delay = min(2*delay, refreshMaxRetry)
		}
		if again {
			retry.Reset(delay)
		}
	}
}

// changed bumps the generation and wakes every subscriber; f.mu is held.
func (f *fleet) changed() {
	f.gen++
	f.notify()
}

// notify wakes every subscriber; f.mu is held.
func (f *fleet) notify() {
	for ch := range f.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// subscribe returns a channel told of every change, and its cancel.
func (f *fleet) subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	f.mu.Lock()
	f.subs[ch] = struct{}{}
	f.mu.Unlock()
	return ch, func() {
		f.mu.Lock()
		delete(f.subs, ch)
		f.mu.Unlock()
	}
}

// fleetPage is what the fleet page shows.
type fleetPage struct {
	// Needs are the rows needing an operator, most pressing first
	// (audit.SortFleet); Rows is every row, by name, the first MaxRows of
	// them, and More how many more match.
	Needs, Rows []audit.FleetRow
	More        int
	// RetiredOut counts the retired nodes left out (All: none are).
	RetiredOut int
	All        bool
	NeedsMore  int
	Matching   int
	Query      string
	Gen        uint64
	Nodes      int
	Now        time.Time
}

// MaxRows is the most rows each table of the fleet page shows; the rest
// are counted, and found with the filter.
const MaxRows = 1000

// page returns the rows of the nodes whose name contains q, at now;
// retired nodes only with all (they leave the fleet, DESIGN.md §9).
func (f *fleet) page(q string, all bool, now time.Time, stale time.Duration) fleetPage {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := fleetPage{Query: q, All: all, Gen: f.gen, Nodes: len(f.views), Now: now}
	for _, name := range slices.Sorted(maps.Keys(f.views)) {
		if !matches(name, q) {
			continue
		}
		nv := f.views[name]
		r := nv.Row(now, stale)
		if nv.Err == nil {
			r.SetWarnings(f.warnings[name])
			if ps := f.sources[name]; len(ps) > 0 {
				r.SetSources(ps)
			}
		}
		if r.Retired && !all {
			p.RetiredOut++
			continue
		}
		p.Matching++
		if len(p.Rows) < MaxRows {
			p.Rows = append(p.Rows, r)
		} else {
			p.More++
		}
		if len(r.Attention) > 0 {
			p.Needs = append(p.Needs, r)
		}
	}
	audit.SortFleet(p.Needs)
	if len(p.Needs) > MaxRows {
		p.NeedsMore = len(p.Needs) - MaxRows
		p.Needs = p.Needs[:MaxRows]
	}
	return p
}

// lastSeen returns the newest sequence of node seen on the stream since
// the console started following (0: none).
func (f *fleet) lastSeen(node string) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last[node]
}

// SourcesEvery is how often the console reads the provisioners' reports
// of unfilled files (a KV bucket, not the stream it follows).
const SourcesEvery = time.Second

// pollSources reads the provisioners' reports every SourcesEvery until
// ctx is done, and tells the pages when they changed.
func (f *fleet) pollSources(ctx context.Context) {
	t := time.NewTicker(SourcesEvery)
	defer t.Stop()
	for {
		ps, err := f.src.Sources(ctx, "")
		if err == nil {
			f.mu.Lock()
			if !reflect.DeepEqual(ps, f.sources) && !(len(ps) == 0 && len(f.sources) == 0) {
				f.sources = ps
				f.changed()
			}
			f.mu.Unlock()
		} else if ctx.Err() == nil {
			f.log.Debug("console: fill statuses", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
