package query

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
)

// NodeView is one node of the fleet as its stored snapshot holds it: its
// view, or why it could not be read.
type NodeView struct {
	Node string
	View reconcile.View
	Err  error
}

// Row returns the node's fleet row at now (audit.FleetRowOfView; a have
// older than stale is stale), or its error row.
func (nv NodeView) Row(now time.Time, stale time.Duration) audit.FleetRow {
	if nv.Err != nil {
		return audit.FleetErrorRow(nv.Node, nv.Err)
	}
	return audit.FleetRowOfView(nv.View, now, stale)
}

// Fleet returns the view of every node the snapshot bucket holds, in
// bucket order, read in one ordered pass; a snapshot that cannot be
// decoded is a view with Err set, not a failure. Snapshots are as fresh
// as the reconciler's last checkpoint. Decoding is most of the cost
// (encoding/json took 0.55 s for 10,000 states of 4.6 kB):
// reconcile.UnmarshalStateShared uses segmentio's decoder without
// copying strings, and the decoding
// runs on one worker per CPU while the read goes on, in batches of
// [fleetBatch] snapshots, so that a fleet's read and its decoding overlap
// (issue 27: at 100,000 nodes one after the other took 6.5× the read
// alone). A reader that needs only the nodes' fleet rows reads
// [Reader.FleetSummary] instead.
//
// Errors: an error wrapping [ErrNoSnapshots] when no reconciler has
// checkpointed yet; the stream's lookup and the read's errors.
func (r *Reader) Fleet(ctx context.Context) ([]NodeView, error) {
	snaps, err := r.snapshots(ctx)
	if err != nil {
		return nil, err
	}
	out, _, _, _, err := decodePipelined(false, nil, nil, func(add func(node string, data []byte)) error {
		return snaps.LoadAll(ctx, func(node string, data []byte) error {
			add(node, data)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("load snapshots: %w", err)
	}
	return out, nil
}

// FleetSummary is [Reader.Fleet] for a reader of fleet rows: each view
// holds only what audit.FleetRowOfView reads
// (reconcile.View.FleetSummary), the same row as the whole view's. The
// views come from the summaries the reconciler stores beside each
// snapshot, in the same message (store.SummaryHeader), read in one pass
// that asks for the headers only (store.Snapshots.ScanSummaries): in the
// bench's mix 780 B a node instead of 2.9 kB, and a small decode each. A
// node whose snapshot has no summary (written by a build that wrote
// none), or one of another format (reconcile.ErrSummaryFormat), is read
// from its snapshot instead: one get each, or a second whole pass when
// more than [fleetGets] need it. Views come in bucket order, those read
// from their snapshots last.
//
// Errors: as [Reader.Fleet].
func (r *Reader) FleetSummary(ctx context.Context) ([]NodeView, error) {
	views, _, _, err := r.fleetSummary(ctx, nil, nil)
	return views, err
}

// FleetRows is [Reader.FleetSummary] made into each node's row at now (a
// have older than stale is stale: NodeView.Row) as each is decoded, on
// the decoding workers; no view is kept (`meshfold fleet`).
func (r *Reader) FleetRows(ctx context.Context, now time.Time, stale time.Duration) ([]audit.FleetRow, error) {
	_, rows, _, err := r.fleetSummary(ctx, func(nv NodeView) audit.FleetRow { return nv.Row(now, stale) }, nil)
	return rows, err
}

// FleetRowsEach is [Reader.FleetRows] for a reader that need not keep the
// rows (`meshfold fleet -o json` keeps each row's JSON and sort key
// instead: at 100,000 nodes the rows held until printed were most of
// its heap, and marked at each collection). fn is called on the decoding
// workers, concurrently, with each batch of rows as it is made (at most
// [fleetBatch]); it must not keep rows, whose memory is used again.
// FleetRowsEach returns fn's results in the order [Reader.FleetRows]
// returns their rows, the rows of a batch in that order too. fn may be
// called for the batches of a pass that is then read again
// (store.ErrSummaryGap): their results are dropped.
//
// Errors: as [Reader.Fleet].
func FleetRowsEach[T any](ctx context.Context, r *Reader, now time.Time, stale time.Duration, fn func(rows []audit.FleetRow) T) ([]T, error) {
	_, _, res, err := r.fleetSummary(ctx, func(nv NodeView) audit.FleetRow { return nv.Row(now, stale) },
		func(rows []audit.FleetRow) any { return fn(rows) })
	if err != nil {
		return nil, err
	}
	out := make([]T, len(res))
	for i, v := range res {
		out[i], _ = v.(T)
	}
	return out, nil
}

// fleetSummary is FleetSummary, or FleetRows when row is not nil, or
// FleetRowsEach when each is not nil too.
func (r *Reader) fleetSummary(ctx context.Context, row func(NodeView) audit.FleetRow, each func([]audit.FleetRow) any) ([]NodeView, []audit.FleetRow, []any, error) {
	snaps, err := r.snapshots(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	var (
		bare, retry []string
		out         []NodeView
		rows        []audit.FleetRow
		res         []any
	)
	// A pass that lost a message is read again, whole: no node twice,
	// none missed.
	for try := 0; ; try++ {
		out, rows, res, retry, err = decodePipelined(true, row, each, func(add func(node string, data []byte)) error {
			var err error
			bare, err = snaps.ScanSummaries(ctx, func(node string, sum []byte) error {
				add(node, sum)
				return nil
			})
			return err
		})
		if !errors.Is(err, store.ErrSummaryGap) || try == 2 {
			break
		}
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("load summaries: %w", store.NoLeaderAnswer("KV_"+r.c.Stream.WithDefaults().Name+store.SnapshotBucketSuffix, err))
	}
	bare = append(bare, retry...)
	if len(bare) == 0 {
		return out, rows, res, nil
	}
	want := make(map[string]bool, len(bare))
	for _, n := range bare {
		want[n] = true
	}
	more, moreRows, moreRes, _, err := decodePipelined(false, row, each, func(add func(node string, data []byte)) error {
		if len(bare) > fleetGets {
			return snaps.LoadAll(ctx, func(node string, data []byte) error {
				if want[node] {
					delete(want, node) // once: a key written again during the pass comes twice
					add(node, data)
				}
				return nil
			})
		}
		for _, node := range bare {
			data, _, err := snaps.GetNode(ctx, node)
			if errors.Is(err, store.ErrNoSnapshot) {
				continue // deleted since
			}
			if err != nil {
				return err
			}
			add(node, data)
		}
		return nil
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("load snapshots without a summary: %w", err)
	}
	return append(out, more...), append(rows, moreRows...), append(res, moreRes...), nil
}

// fleetGets is how many snapshots [Reader.FleetSummary] reads one get at
// a time when their summaries are missing; more are read in a whole
// pass.
var fleetGets = 1000

// decodePipelined calls scan, which hands each node's snapshot (or, with
// summaries, its summary) to add as it reads it, and decodes them on one
// worker per CPU while the read goes on, in batches of [fleetBatch]. It
// returns the views in the order scan added them (with row set, their
// rows instead; with each set too, each's result for each batch of rows,
// the rows not kept), and, with summaries, the nodes whose summary did not
// decode (of another format): read their snapshots.
func decodePipelined(summaries bool, row func(NodeView) audit.FleetRow, each func([]audit.FleetRow) any, scan func(add func(node string, data []byte)) error) ([]NodeView, []audit.FleetRow, []any, []string, error) {
	// The queue never blocks the read (a watch whose reader stalls falls
	// behind its server) short of 4M snapshots waiting.
	jobs := make(chan *fleetJob, 1<<14)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			var rows []audit.FleetRow // used again batch after batch, with each
			for j := range jobs {
				rows = j.decode(rows)
			}
		})
	}
	var batches []*fleetJob
	newJob := func() *fleetJob {
		return &fleetJob{summaries: summaries, row: row, each: each,
			nodes: make([]string, 0, fleetBatch), data: make([][]byte, 0, fleetBatch)}
	}
	cur := newJob()
	err := scan(func(node string, data []byte) {
		cur.nodes = append(cur.nodes, node)
		cur.data = append(cur.data, data)
		if len(cur.nodes) == fleetBatch {
			batches = append(batches, cur)
			jobs <- cur
			cur = newJob()
		}
	})
	if len(cur.nodes) > 0 {
		batches = append(batches, cur)
		jobs <- cur
	}
	close(jobs)
	wg.Wait()
	if err != nil {
		return nil, nil, nil, nil, err
	}
	n := 0
	for _, b := range batches {
		n += len(b.out) + len(b.rows)
	}
	var (
		out   []NodeView
		rows  []audit.FleetRow
		res   []any
		retry []string
	)
	switch {
	case each != nil:
		res = make([]any, 0, len(batches))
	case row != nil:
		rows = make([]audit.FleetRow, 0, n)
	default:
		out = make([]NodeView, 0, n)
	}
	for _, b := range batches {
		out = append(out, b.out...)
		rows = append(rows, b.rows...)
		if each != nil {
			res = append(res, b.res)
		}
		retry = append(retry, b.retry...)
	}
	return out, rows, res, retry, nil
}

// fleetBatch is how many snapshots one decoding job of [Reader.Fleet]
// holds.
var fleetBatch = 256

// fleetJob is a batch of snapshots (or of summaries), in bucket order,
// and their views.
type fleetJob struct {
	summaries bool
	row       func(NodeView) audit.FleetRow // nil: keep the views
	each      func([]audit.FleetRow) any    // not nil: hand it the rows, keep its result
	res       any                           // each's result
	nodes     []string
	data      [][]byte
	out       []NodeView
	rows      []audit.FleetRow
	retry     []string // summaries that did not decode
}

// decode fills j.out, or j.rows, or j.res (with j.each: the rows made in
// buf, which it returns to be used again). The views share the snapshots' bytes
// (reconcile.UnmarshalStateShared, UnmarshalSummary): nothing writes
// them once read.
func (j *fleetJob) decode(buf []audit.FleetRow) []audit.FleetRow {
	switch {
	case j.each != nil:
		j.rows = buf[:0] // each row is written whole over the last batch's
	case j.row != nil:
		j.rows = make([]audit.FleetRow, 0, len(j.nodes))
	default:
		j.out = make([]NodeView, 0, len(j.nodes))
	}
	for i, node := range j.nodes {
		nv := NodeView{Node: node}
		if j.summaries {
			v, err := reconcile.UnmarshalSummary(j.data[i])
			if err != nil {
				j.retry = append(j.retry, node)
				continue
			}
			nv.View = v
		} else if st, err := reconcile.UnmarshalStateShared(j.data[i]); err != nil {
			nv.Err = err
		} else {
			nv.View = st.View()
		}
		if j.row != nil {
			j.rows = append(j.rows, j.row(nv))
		} else {
			j.out = append(j.out, nv)
		}
	}
	j.data = nil
	if j.each == nil {
		return buf
	}
	j.res = j.each(j.rows)
	buf = j.rows
	j.rows = nil
	return buf
}

// WarningSeqs is [Reader.Warnings] with each entry's stream sequence
// (store.JournalWarningSeqs), for [audit.FleetRow.SetWarningSeqs].
func (r *Reader) WarningSeqs(ctx context.Context, since time.Time) (map[string][]uint64, error) {
	_, cfg, err := r.open(ctx)
	if err != nil {
		return nil, err
	}
	return store.JournalWarningSeqs(ctx, r.js, cfg, since)
}

// Warnings counts each node's journal entries of level warn or error
// stored at or after since (store.JournalWarnings: DESIGN.md §6's journal
// warnings); entries no node's journal can hold count under
// events.FleetNode.
//
// Errors: the stream's lookup and the read's errors.
func (r *Reader) Warnings(ctx context.Context, since time.Time) (map[string]int, error) {
	_, cfg, err := r.open(ctx)
	if err != nil {
		return nil, err
	}
	return store.JournalWarnings(ctx, r.js, cfg, since)
}

// JournalAt returns the journal entry stored at seq, read with a direct
// get: fleet names the warnings WarningSeqs found.
//
// Errors: the stream's lookup and the get's errors; the message at seq
// is no journal entry (matching events.ErrInvalid when it does not
// decode).
func (r *Reader) JournalAt(ctx context.Context, seq uint64) (*events.Journal, error) {
	stream, cfg, err := r.open(ctx)
	if err != nil {
		return nil, err
	}
	raw, err := stream.GetMsg(ctx, seq)
	if err != nil {
		return nil, fmt.Errorf("journal entry %d: %w", seq, err)
	}
	ev, err := cfg.Subjects().DecodeEvent(raw.Subject, raw.Data, raw.Sequence, raw.Time)
	if err != nil {
		return nil, fmt.Errorf("journal entry %d: %w", seq, err)
	}
	j, ok := ev.Payload.(*events.Journal)
	if !ok {
		return nil, fmt.Errorf("journal entry %d: a %s, not a journal entry", seq, ev.Kind)
	}
	return j, nil
}
