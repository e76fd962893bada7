package query

import (
	"context"
	"errors"
	"fmt"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
)

// Source says where a node's state came from.
type Source string

// The sources of a node's state, freshest first: a read takes the first
// that answers.
const (
	// SourceReconciler: the reconciler's state service answered (live).
	SourceReconciler Source = "reconciler"
	// SourceSnapshot: no reconciler answered; the node's stored snapshot,
	// and the stream holds no event of the node past it (it is as new as
	// the node's events).
	SourceSnapshot Source = "snapshot"
	// SourceSnapshotStream: no reconciler answered; the node's stored
	// snapshot, and its events past it read from the stream and folded
	// here with the reconciler's fold (the snapshot lagged them: a
	// reconciler checkpoints a changed state a few checkpoints later,
	// and none folds while every reconciler is down).
	SourceSnapshotStream Source = "snapshot+stream"
	// SourceStream: no reconciler answered; the node's events, read from
	// the stream and folded here with the reconciler's fold.
	SourceStream Source = "stream"
	// SourceUnfolded: the reconciler answered that it has folded no event
	// of the node, but the stream holds some: it is behind, or cannot
	// fold that node's partition (a session that cannot store its
	// snapshot, a full data directory); the node's events, read from the
	// stream and folded here.
	SourceUnfolded Source = "stream-unfolded"
	// SourceNone: nothing is known of the node (a dry run composes from
	// the empty state).
	SourceNone Source = "none"
)

// Text says where a state came from, as `meshfold state`, the dry run and
// the console print it.
func (s Source) Text() string {
	switch s {
	case SourceReconciler:
		return "the reconciler (live)"
	case SourceSnapshot:
		return "the stored snapshot: no reconciler answered, and the stream holds no newer event of the node"
	case SourceSnapshotStream:
		return "the stored snapshot and the node's events past it, read from the stream: no reconciler answered"
	case SourceStream:
		return "a replay of the stream: no reconciler answered"
	case SourceUnfolded:
		return "a replay of the stream: the reconciler has not folded this node's events yet " +
			"(it is behind, or cannot store: a full data directory? see its log)"
	}
	return "nothing: no event of the node is known yet"
}

// NodeState is a node's current state as a reader sees it.
type NodeState struct {
	Source      Source
	View        reconcile.View
	Composition reconcile.Composition
}

// Live asks the reconciler's state service alone for node's view and
// composition, as [RequestState].
func (r *Reader) Live(ctx context.Context, node string) (reconcile.View, reconcile.Composition, error) {
	return RequestState(ctx, r.nc, r.pre, node, r.c.Timeout)
}

// State returns node's current state: the reconciler's (live), else,
// when none answers, its stored snapshot, else its events folded from
// the stream; Source says which.
//
// A node the reconciler answers it has folded no event of, while the
// stream holds some (the reconciler is behind, or cannot fold its
// partition: a full data directory), is folded here from the stream,
// [SourceUnfolded]: such a node is never called unknown.
//
// Errors: [ErrUnknownNode] when neither the reconciler nor the stream
// knows node (nor, when none answers, a snapshot);
// a bad node name (matching events.ErrInvalid); an undecodable snapshot;
// the reads' errors.
func (r *Reader) State(ctx context.Context, node string) (NodeState, error) {
	v, c, err := r.Live(ctx, node)
	if err == nil {
		return NodeState{Source: SourceReconciler, View: v, Composition: c}, nil
	}
	if errors.Is(err, ErrUnknownNode) {
		st, err := r.unfolded(ctx, node)
		if err != nil {
			return NodeState{}, err
		}
		return NodeState{Source: SourceUnfolded, View: st.View(), Composition: reconcile.CompositionOf(st)}, nil
	}
	if err := r.notLive(node, err); err != nil {
		return NodeState{}, err
	}
	st, src, err := r.stored(ctx, node)
	if err != nil {
		return NodeState{}, err
	}
	return NodeState{Source: src, View: st.View(), Composition: reconcile.CompositionOf(st)}, nil
}

// Fold returns node's whole folded state (the snapshot form), from the
// same sources as [Reader.State] and with the same errors. The state
// service's fold endpoint answers the operator role, not operator-read
// (store/auth).
func (r *Reader) Fold(ctx context.Context, node string) (*reconcile.State, Source, error) {
	st, err := RequestFold(ctx, r.nc, r.pre, node, r.c.Timeout)
	if err == nil {
		return st, SourceReconciler, nil
	}
	if errors.Is(err, ErrUnknownNode) {
		st, err := r.unfolded(ctx, node)
		if err != nil {
			return nil, "", err
		}
		return st, SourceUnfolded, nil
	}
	if err := r.notLive(node, err); err != nil {
		return nil, "", err
	}
	return r.stored(ctx, node)
}

// DryRun returns what the reconciler would plan now for want w of node
// (reconcile.State.DryRun), composed from node's folded state as
// [Reader.Fold] finds it; a node nothing is known of composes from the
// empty state, [SourceNone]. Nothing is published.
//
// Errors: as [Reader.Fold], but never [ErrUnknownNode].
func (r *Reader) DryRun(ctx context.Context, node string, w *events.Want) (reconcile.DryRun, Source, error) {
	st, src, err := r.Fold(ctx, node)
	if errors.Is(err, ErrUnknownNode) {
		st, src, err = reconcile.NewState(node), SourceNone, nil
	}
	if err != nil {
		return reconcile.DryRun{}, "", err
	}
	return st.DryRun(w.Modules), src, nil
}

// notLive returns nil when a state service request failed because no
// reconciler answered (the read goes on to what is stored), else the
// error to return.
func (r *Reader) notLive(node string, err error) error {
	if errors.Is(err, ErrNoReconciler) {
		return nil
	}
	return err
}

// unfolded is the state of a node the reconciler answered it has folded
// no event of: folded here from the stream's events of it when there are
// some (the reconciler is behind, or its partition cannot fold: never
// call such a node unknown), else [ErrUnknownNode].
func (r *Reader) unfolded(ctx context.Context, node string) (*reconcile.State, error) {
	h, err := r.History(ctx, node, Bounds{})
	if err != nil {
		return nil, fmt.Errorf("the reconciler has folded no event of node %q, and its events could not be read: %w", node, err)
	}
	if len(h.Events) == 0 {
		return nil, wrap(ErrUnknownNode, "node %q is unknown: the reconciler has folded no event of it, and the stream holds none", node)
	}
	return h.Fold(len(h.Events)), nil
}

// Stored returns node's state as [Reader.Fold] does when no reconciler
// answers: from its snapshot, else from its events in the stream, without
// asking the reconciler. For credentials that may not ask the state
// service's fold endpoint (the operator-read role: store/auth).
//
// Errors: as [Reader.Fold].
func (r *Reader) Stored(ctx context.Context, node string) (*reconcile.State, Source, error) {
	return r.stored(ctx, node)
}

// stored returns node's state from its snapshot and its events past it
// in the stream, else (no snapshot, or one of a newer format than this
// build reads) from its events in the stream.
func (r *Reader) stored(ctx context.Context, node string) (*reconcile.State, Source, error) {
	none := "no snapshot holds it"
	snaps, err := r.snapshots(ctx)
	switch {
	case errors.Is(err, ErrNoSnapshots):
		none = err.Error()
	case err != nil:
		return nil, "", fmt.Errorf("no reconciler answered, and %w", err)
	default:
		data, _, err := snaps.GetNode(ctx, node)
		if err == nil {
			st, err := reconcile.UnmarshalState(data)
			switch {
			case errors.Is(err, reconcile.ErrSnapshotNewer):
				// A newer build wrote it: fold the stream, as a
				// reconciler of this build would.
				none = err.Error()
			case err != nil:
				return nil, "", fmt.Errorf("snapshot of %s: %w", node, err)
			default:
				return r.pastSnapshot(ctx, st)
			}
		} else if !errors.Is(err, store.ErrNoSnapshot) {
			return nil, "", err
		}
	}
	h, err := r.History(ctx, node, Bounds{})
	if err != nil {
		return nil, "", err
	}
	if len(h.Events) == 0 {
		return nil, "", wrap(ErrUnknownNode, "node %q is unknown: no reconciler answered and %s, and the stream holds no event of it", node, none)
	}
	return h.Fold(len(h.Events)), SourceStream, nil
}

// pastSnapshot folds into st, a node's stored snapshot, the node's events
// the stream holds past it (st.Seq), as the reconciler does when it
// resumes the node's partition from its snapshot: [SourceSnapshot] when
// there are none, [SourceSnapshotStream] when some were folded. With no
// reconciler up, the snapshot is as old as the last checkpoint before the
// outage, and the node's haves, settles and wants since were not in it (a
// fresh user's finding M9: `state` answered from a snapshot 2,000 events
// behind the node's newest have while `fleet` said it "folds one from the
// stream").
//
// Errors: the stream's lookup and the read's errors, saying that no
// reconciler answered.
func (r *Reader) pastSnapshot(ctx context.Context, st *reconcile.State) (*reconcile.State, Source, error) {
	_, cfg, err := r.open(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("no reconciler answered, and %s's events past its snapshot (#%d) could not be read: %w", st.Node, st.Seq, err)
	}
	n := 0
	err = store.ReadNode(ctx, r.js, cfg.Name, cfg.Subjects(), st.Node, st.Seq+1, 0, func(m store.Msg) error {
		st.Fold(m.Event)
		n++
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("no reconciler answered, and %s's events past its snapshot (#%d) could not be read: %w", st.Node, st.Seq, err)
	}
	if n == 0 {
		return st, SourceSnapshot, nil
	}
	return st, SourceSnapshotStream, nil
}
