package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
)

// How much `meshfold fleet` (the table) reads past the snapshots: the
// events of a partition past its checkpoint, at most fleetTailMax of
// them (the reconciler keeps that tail to a few checkpoint periods,
// docs/architecture.md "Live: states put by age"), and the live state
// of at most fleetLiveMax nodes they name, fleetLiveWorkers requests at
// a time.
var (
	fleetTailMax     = query.DefaultTailMax
	fleetLiveMax     = 500
	fleetLiveWorkers = 8
)

// fleetLag is how current the snapshots `meshfold fleet` read are, and
// what the table did about nodes whose events are newer.
type fleetLag struct {
	lag      query.SnapshotLag
	complete bool     // every event past the checkpoints was read
	live     []string // nodes whose rows were read live, sorted
	behind   []string // nodes with events past their stored state not read live, sorted
	why      string   // why they were not ("" when they all were)
	// noneUp: no reconciler answered for the nodes of the partitions
	// down (sorted): none folds their events.
	noneUp bool
	down   []int
	// folded are the nodes whose rows were folded here, no reconciler
	// answering: their snapshots with their events past them
	// (query.Reader.SnapshotsPast), sorted.
	folded []string
	// since is, when no reconciler answered, the stream time of the
	// oldest event past a lagging partition's checkpoint (zero when the
	// events could not be read): no reconciler folded it, nor anything
	// of those partitions since.
	since time.Time
	// foldErr is why the nodes no reconciler answered for could not be
	// folded here (nil: they were, or none was to be).
	foldErr error
	// tailErr: the events past the checkpoints could not be read, so
	// which nodes they name is not known (complete is false, and no
	// count was made: the table must not say one).
	tailErr error
}

// checkpointAges returns the age of the newest and of the oldest
// checkpoint among partitions that hold events (ok false when none has
// a checkpoint).
func (f *fleetLag) checkpointAges(now time.Time) (newest, oldest time.Duration, ok bool) {
	for _, p := range f.lag.Partitions {
		if p.Last == 0 || p.CheckpointTime.IsZero() {
			continue
		}
		age := now.Sub(p.CheckpointTime)
		if !ok {
			newest, oldest, ok = age, age, true
			continue
		}
		newest, oldest = min(newest, age), max(oldest, age)
	}
	return newest, oldest, ok
}

// text is the table's line saying how current it is.
func (f *fleetLag) text(now time.Time) string {
	var b strings.Builder
	b.WriteString("-- as of the reconciler's snapshots")
	if newest, oldest, ok := f.checkpointAges(now); ok {
		fmt.Fprintf(&b, ", checkpointed %s ago", audit.Age(newest))
		if audit.Age(oldest) != audit.Age(newest) {
			fmt.Fprintf(&b, " (the oldest partition's %s ago)", audit.Age(oldest))
		}
	} else {
		b.WriteString(" (no partition checkpointed yet)")
	}
	if !slices.ContainsFunc(f.lag.Partitions, func(p query.PartitionLag) bool { return p.Last > 0 }) {
		b.WriteString(": the stream holds no event of any node\n")
		return b.String()
	}
	behind := f.lag.Behind()
	if len(behind) == 0 {
		b.WriteString(": the stream holds no newer event\n")
		return b.String()
	}
	if len(f.live) == 0 && len(f.folded) == 0 && len(f.behind) == 0 && f.complete {
		b.WriteString("; the stream's newer events are in every row already")
	}
	if len(f.live) > 0 {
		fmt.Fprintf(&b, "; %s with events past them read live from the reconciler (%s)", plural(len(f.live), "node"), nameList(f.live))
	}
	if len(f.folded) > 0 {
		fmt.Fprintf(&b, "; %s with events past them folded here from the stream, no reconciler answering (%s)", plural(len(f.folded), "node"), nameList(f.folded))
	}
	if len(f.behind) > 0 {
		has := "have"
		if len(f.behind) == 1 {
			has = "has"
		}
		how := "reads one live"
		if f.noneUp {
			how = "folds one from the stream"
		}
		fmt.Fprintf(&b, "; the snapshots lag the stream: %s %s events past them (%s), %s, so %s may be older than %s; 'meshfold state NODE' %s",
			plural(len(f.behind), "node"), has, nameList(f.behind), f.why,
			map[bool]string{true: "its row (or its absence)", false: "their rows (or their absence)"}[len(f.behind) == 1],
			map[bool]string{true: "its events", false: "their events"}[len(f.behind) == 1], how)
	}
	switch {
	case f.tailErr != nil:
		// Nothing was counted: saying "more than N events" here was a
		// guess (a fresh user's finding M2: during an outage the line
		// said more than 20000 of a stream of 3,400).
		fmt.Fprintf(&b, "; which nodes have events past the checkpoints could not be read (%v): any row may be older than its events (run fleet again once the stream answers)", f.tailErr)
	case !f.complete:
		fmt.Fprintf(&b, "; more than %d events past a partition's checkpoint: other rows may be older than their events too (run fleet again once the reconciler has checkpointed)", fleetTailMax)
	}
	b.WriteString("\n")
	return b.String()
}

// first is the line the table begins with when no reconciler answered
// ("" otherwise): the one thing to fix, before any node's row (a fresh
// user's finding M9: with every reconciler killed, the table blamed a
// growing count of nodes for a stale have, and nothing said that no
// reconciler answered). Partitions are those with events past their
// checkpoint: a partition with none has nothing waiting for a reconciler.
func (f *fleetLag) first(now time.Time) string {
	if !f.noneUp {
		return ""
	}
	var parts []string
	for _, p := range f.down {
		parts = append(parts, strconv.Itoa(p))
	}
	since := ""
	if !f.since.IsZero() {
		since = fmt.Sprintf(" since %s (%s ago)", audit.FormatTime(f.since), audit.Age(max(0, now.Sub(f.since))))
	}
	of := "partition"
	if len(parts) > 1 {
		of = "partitions"
	}
	return fmt.Sprintf("-- NO RECONCILER ANSWERS for the nodes of %s %s (of %d): their events%s are folded by none, so no plan, knock or rollout step follows them until one runs again ('meshfold reconcile' or 'meshfold serve'; its log says why it stopped); the rows below fold them here from the snapshots and the stream\n",
		of, strings.Join(parts, ", "), len(f.lag.Partitions), since)
}

// nameList names up to five nodes, then how many more.
func nameList(nodes []string) string {
	if len(nodes) <= 5 {
		return strings.Join(nodes, ", ")
	}
	return strings.Join(nodes[:5], ", ") + fmt.Sprintf(" and %d more", len(nodes)-5)
}

// refreshLagging makes rows current where the snapshots lag the stream
// (the table's rows, before they are filtered and sorted): for each node
// the events past its partition's checkpoint name whose row is older than
// its newest event (or that has no row: a node no snapshot holds yet), it
// asks the reconciler's state service for the node's view and puts the
// row made from it (annotated) in its place. Nodes it could not read so
// are listed in the returned fleetLag, with why.
func refreshLagging(ctx context.Context, r *query.Reader, rows []audit.FleetRow, lag query.SnapshotLag, now time.Time, stale time.Duration, annotate func(*audit.FleetRow)) ([]audit.FleetRow, *fleetLag) {
	f := &fleetLag{lag: lag, complete: true}
	if len(lag.Behind()) == 0 {
		return rows, f
	}
	tail, complete, err := r.TailNodes(ctx, lag, fleetTailMax)
	if err != nil {
		f.complete, f.tailErr = false, err
		return rows, f
	}
	f.complete = complete
	at := make(map[string]int, len(rows))
	for i := range rows {
		at[rows[i].Node] = i
	}
	want := query.LaggingNodes(tail, func(node string) (uint64, bool) {
		i, ok := at[node]
		if !ok {
			return 0, false
		}
		return rows[i].Seq, true
	})
	ask := want[:min(len(want), fleetLiveMax)]
	views := make([]*audit.FleetRow, len(ask))
	// A partition whose node got no answer is asked no more: with every
	// reconciler down, each ask is another wait; with one of a group
	// down, the others answer for their partitions.
	parts := len(lag.Partitions)
	var (
		mu   sync.Mutex
		down = map[int]bool{} // partitions no reconciler answered for
		wg   sync.WaitGroup
		next = make(chan int)
	)
	for range fleetLiveWorkers {
		wg.Go(func() {
			for i := range next {
				p := events.Partition(ask[i], parts)
				mu.Lock()
				skip := down[p]
				mu.Unlock()
				if skip {
					continue
				}
				v, err := r.LiveView(ctx, ask[i])
				if errors.Is(err, query.ErrNoReconciler) {
					mu.Lock()
					down[p] = true
					mu.Unlock()
				}
				if err != nil {
					continue
				}
				row := audit.FleetRowOfView(v, now, stale)
				annotate(&row)
				views[i] = &row
			}
		})
	}
	for i := range ask {
		next <- i
	}
	close(next)
	wg.Wait()
	noneUp := len(down) > 0
	if noneUp {
		// No reconciler to ask for these: the nodes' snapshots with
		// their events past them, folded here as the reconciler would
		// (a fresh user's finding M9: their rows said "stale-have" from
		// snapshots the command knew lagged the nodes' haves).
		f.down = slices.Sorted(maps.Keys(down))
		var unread []string
		idx := make(map[string]int, len(ask))
		for i, node := range ask {
			idx[node] = i
			if views[i] == nil && down[events.Partition(node, parts)] {
				unread = append(unread, node)
			}
		}
		set := make(map[string]bool, len(unread))
		for _, n := range unread {
			set[n] = true
		}
		var downLag query.SnapshotLag
		for _, p := range lag.Partitions {
			if !down[p.Partition] {
				p.Last = p.Checkpoint // not read again: a reconciler answers for it
			}
			downLag.Partitions = append(downLag.Partitions, p)
		}
		t, err := r.TailEvents(ctx, downLag, fleetTailMax, func(node string) bool { return set[node] })
		var states map[string]*reconcile.State
		if err == nil {
			for _, ts := range t.Since {
				if f.since.IsZero() || ts.Before(f.since) {
					f.since = ts
				}
			}
			states, _, err = r.SnapshotsPast(ctx, t, unread, fleetLiveWorkers)
		}
		f.foldErr = err
		for node, st := range states {
			row := audit.FleetRowOf(st, now, stale)
			annotate(&row)
			views[idx[node]] = &row
			f.folded = append(f.folded, node)
		}
		slices.Sort(f.folded)
	}
	for i, node := range ask {
		if views[i] == nil {
			f.behind = append(f.behind, node)
			continue
		}
		if _, ok := slices.BinarySearch(f.folded, node); !ok {
			f.live = append(f.live, node)
		}
		if j, ok := at[node]; ok {
			rows[j] = *views[i]
		} else {
			rows = append(rows, *views[i])
		}
	}
	f.behind = append(f.behind, want[len(ask):]...)
	// A row left older than the node's events says so, and is not
	// blamed for a stale have: its have may be in the events past it.
	for _, node := range f.behind {
		if j, ok := at[node]; ok {
			rows[j].SetNewest(tail[node])
		}
	}
	switch {
	case noneUp:
		f.noneUp = true
		f.why = "and no reconciler answered to read them live"
		if f.foldErr != nil {
			f.why += fmt.Sprintf(" (nor could they be folded here: %v)", f.foldErr)
		}
	case len(want) > len(ask):
		f.why = fmt.Sprintf("past the %d this table reads live", fleetLiveMax)
	default:
		f.why = "and the reconciler did not answer for them"
	}
	return rows, f
}

// lagNote is what `fleet -o json|yaml` says on stderr when the snapshots
// lag the stream: its lines are the snapshots as stored (the table reads
// the lagging nodes live; those formats keep the snapshot's one pass).
func lagNote(lag query.SnapshotLag, now time.Time, tail lagTail) string {
	behind := lag.Behind()
	if len(behind) == 0 {
		return ""
	}
	newest := behind[0].LastTime
	for _, p := range behind {
		if p.LastTime.After(newest) {
			newest = p.LastTime
		}
	}
	marked := ` (those lines say "behind":true, with the newest event's "newest_seq")`
	switch {
	case tail.err != nil:
		marked = fmt.Sprintf(" (which nodes have them could not be read: %v; no line says \"behind\")", tail.err)
	case !tail.complete:
		marked = fmt.Sprintf(` (those lines say "behind":true, with the newest event's "newest_seq", as far as the first %d events past a partition's checkpoint tell: other lines may be behind too)`, fleetTailMax)
	}
	return fmt.Sprintf("note: the snapshots lag the stream: %s %s events newer than %s checkpoint (the newest %s ago), so the lines of nodes with such events may be older than them%s; 'meshfold fleet' (the table) reads those nodes live, 'meshfold state NODE -o json' one node\n",
		plural(len(behind), "partition"), map[bool]string{true: "holds", false: "hold"}[len(behind) == 1], map[bool]string{true: "its", false: "their"}[len(behind) == 1], audit.Age(max(0, now.Sub(newest))), marked)
}

// lagTail is what fleet -o json and -o yaml read past the lagging
// checkpoints (query.Reader.TailNodes): each node with events there and
// its newest event's sequence, whether every event was read, or why none.
type lagTail struct {
	nodes    map[string]uint64
	complete bool
	err      error
}
