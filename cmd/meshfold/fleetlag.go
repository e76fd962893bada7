package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshfold/meshfold/query"
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
	noneUp   bool     // no reconciler answered
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
	if len(f.live) == 0 && len(f.behind) == 0 && f.complete {
		b.WriteString("; the stream's newer events are in every row already")
	}
	if len(f.live) > 0 {
		fmt.Fprintf(&b, "; %s with events past them read live from the reconciler (%s)", plural(len(f.live), "node"), nameList(f.live))
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
	var (
		mu     sync.Mutex
		noneUp bool // no reconciler answered: ask no more
		wg     sync.WaitGroup
		next   = make(chan int)
	)
	for range fleetLiveWorkers {
		wg.Go(func() {
			for i := range next {
				mu.Lock()
				skip := noneUp
				mu.Unlock()
				if skip {
					continue
				}
				v, err := r.LiveView(ctx, ask[i])
				if errors.Is(err, query.ErrNoReconciler) {
					mu.Lock()
					noneUp = true
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
	for i, node := range ask {
		if views[i] == nil {
			f.behind = append(f.behind, node)
			continue
		}
		f.live = append(f.live, node)
		if j, ok := at[node]; ok {
			rows[j] = *views[i]
		} else {
			rows = append(rows, *views[i])
		}
	}
	f.behind = append(f.behind, want[len(ask):]...)
	switch {
	case noneUp:
		f.noneUp = true
		f.why = "and no reconciler answered to read them live"
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
