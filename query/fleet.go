package query

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

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
// reconcile.UnmarshalState uses segmentio's decoder, and the decoding runs
// on one worker per CPU.
//
// Errors: an error wrapping [ErrNoSnapshots] when no reconciler has
// checkpointed yet; the stream's lookup and the read's errors.
func (r *Reader) Fleet(ctx context.Context) ([]NodeView, error) {
	snaps, err := r.snapshots(ctx)
	if err != nil {
		return nil, err
	}
	type raw struct {
		node string
		data []byte
	}
	var all []raw
	err = snaps.LoadAll(ctx, func(node string, data []byte) error {
		all = append(all, raw{node, data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load snapshots: %w", err)
	}
	out := make([]NodeView, len(all))
	workers := min(runtime.GOMAXPROCS(0), max(1, len(all)/256))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(all); i += workers {
				out[i].Node = all[i].node
				st, err := reconcile.UnmarshalState(all[i].data)
				if err != nil {
					out[i].Err = err
					continue
				}
				out[i].View = st.View()
			}
		}()
	}
	wg.Wait()
	return out, nil
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
