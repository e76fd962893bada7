package query

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
)

// PartitionLag is one partition of the stream beside its snapshot
// checkpoint: how current the states the snapshot bucket holds for its
// nodes are.
type PartitionLag struct {
	Partition int
	// Checkpoint is the stream sequence up to which every state stored
	// for the partition's nodes covers their events (0: none yet);
	// CheckpointTime when it was stored (zero: none).
	Checkpoint     uint64
	CheckpointTime time.Time
	// Last is the sequence of the partition's newest event in the stream
	// (0: none), LastTime its stream time.
	Last     uint64
	LastTime time.Time
}

// Behind reports whether the stream holds events of the partition newer
// than its checkpoint: a node's stored state may then be older than its
// events (the reconciler puts a changed state a few checkpoints later,
// docs/architecture.md "Live: states put by age").
func (p PartitionLag) Behind() bool { return p.Last > p.Checkpoint }

// SnapshotLag is the snapshot bucket beside the stream, one entry a
// partition, in partition order.
type SnapshotLag struct {
	Partitions []PartitionLag
}

// Behind returns the partitions whose events go past their checkpoint.
func (l SnapshotLag) Behind() []PartitionLag {
	var out []PartitionLag
	for _, p := range l.Partitions {
		if p.Behind() {
			out = append(out, p)
		}
	}
	return out
}

// Through returns l's checkpoints with later's newest events: the events
// past the checkpoints a reader read before it loaded the snapshots, up
// to the newest as later (read after it began to follow the stream) saw
// them, so that each is either read past the checkpoint or followed.
//
// Errors: later is of another number of partitions (the stream changed).
func (l SnapshotLag) Through(later SnapshotLag) (SnapshotLag, error) {
	if len(later.Partitions) != len(l.Partitions) {
		return SnapshotLag{}, fmt.Errorf("query: the stream has %d partitions, not %d", len(later.Partitions), len(l.Partitions))
	}
	out := SnapshotLag{Partitions: slices.Clone(l.Partitions)}
	for i, p := range later.Partitions {
		if p.Last > out.Partitions[i].Last {
			out.Partitions[i].Last, out.Partitions[i].LastTime = p.Last, p.LastTime
		}
	}
	return out, nil
}

// Lag reads every partition's checkpoint and the newest event the stream
// holds of it (two small requests a partition, all at once): whether the
// fleet the snapshots give ([Reader.FleetRows]) is the stream's as it is
// now, and if not, since when. The newest event is read from the stream's
// leader (store.LeaderReads), so that an event just acknowledged counts.
//
// Errors: an error wrapping [ErrNoSnapshots] when the bucket does not
// exist; the stream's lookup and the reads' errors.
func (r *Reader) Lag(ctx context.Context) (SnapshotLag, error) {
	snaps, err := r.snapshots(ctx)
	if err != nil {
		return SnapshotLag{}, err
	}
	_, cfg, err := r.open(ctx)
	if err != nil {
		return SnapshotLag{}, err
	}
	subj := cfg.Subjects()
	leader := store.Leader(r.js, cfg.Name)
	out := SnapshotLag{Partitions: make([]PartitionLag, subj.N())}
	errs := make([]error, subj.N())
	var wg sync.WaitGroup
	for p := range out.Partitions {
		wg.Go(func() {
			pl := PartitionLag{Partition: p}
			var err error
			pl.Checkpoint, pl.CheckpointTime, err = snaps.CheckpointAt(ctx, p)
			if err != nil {
				errs[p] = err
				return
			}
			m, err := leader.GetLastMsgForSubject(ctx, subj.StoredPartitionAll(p))
			switch {
			case errors.Is(err, jetstream.ErrMsgNotFound):
			case err != nil:
				errs[p] = fmt.Errorf("newest event of partition %d: %w", p, err)
				return
			default:
				pl.Last, pl.LastTime = m.Sequence, m.Time
			}
			out.Partitions[p] = pl
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return SnapshotLag{}, err
	}
	return out, nil
}

// TailNodes reads the events of each partition of lag that is behind,
// past its checkpoint up to its newest event as Lag saw it (as the
// stream's leader has it, whatever replica the read is placed on), and returns
// each node they name with the sequence of its newest one of a kind the
// reconciler folds (events.Kind.Input: its own knocks and journal entries
// never move a state's Seq): the nodes whose stored state may be older
// than their events. Only subjects are
// read, not payloads. A partition with more than limit such events is not
// read past limit (complete is then false: some nodes may be missing).
//
// Errors: the stream's lookup; the reads' errors; ctx's.
func (r *Reader) TailNodes(ctx context.Context, lag SnapshotLag, limit int) (nodes map[string]uint64, complete bool, err error) {
	nodes = map[string]uint64{}
	complete, err = r.tailEach(ctx, lag, limit, func(_ int, t *store.Tail, x store.Tailed, node string) {
		nodes[node] = max(nodes[node], x.Meta.Sequence.Stream)
	})
	if err != nil {
		return nil, false, err
	}
	return nodes, complete, nil
}

// Tail is what [Reader.TailEvents] read past the checkpoints.
type Tail struct {
	// Events are, for each node asked for, its events past its
	// partition's checkpoint, in stream order, decoded (an undecodable
	// one has Err set, as the reconciler's fold takes it).
	Events map[string][]events.Event
	// Since is, for each partition read, the stream time of its first
	// event past its checkpoint of a kind the reconciler folds: no
	// reconciler folded it then, nor any event of the partition since.
	Since map[int]time.Time
	// Complete: every event past the checkpoints was read (none was past
	// the limit).
	Complete bool
}

// TailEvents is [Reader.TailNodes] reading the payloads too: the events
// past each lagging partition's checkpoint (up to limit a partition) of
// the nodes want says yes to, decoded, so that a reader with no
// reconciler to ask folds them into the nodes' snapshots as the
// reconciler would ([FoldPast]). One consumer a lagging partition, not
// one a node: the consumers' creations are what a meta leader answers.
//
// Errors: as [Reader.TailNodes].
func (r *Reader) TailEvents(ctx context.Context, lag SnapshotLag, limit int, want func(node string) bool) (Tail, error) {
	out := Tail{Events: map[string][]events.Event{}, Since: map[int]time.Time{}}
	var err error
	out.Complete, err = r.tailEach(ctx, lag, limit, func(p int, t *store.Tail, x store.Tailed, node string) {
		if _, ok := out.Since[p]; !ok {
			out.Since[p] = x.Meta.Timestamp
		}
		if want(node) {
			out.Events[node] = append(out.Events[node], t.Decode(x).Event)
		}
	})
	if err != nil {
		return Tail{}, err
	}
	return out, nil
}

// FoldPast folds into st, a node's stored state, its events evs (read
// past its partition's checkpoint, in stream order) that are past st.Seq,
// and returns how many it folded: the node's state as the reconciler
// would have it had it folded them.
func FoldPast(st *reconcile.State, evs []events.Event) int {
	n := 0
	for _, ev := range evs {
		if ev.Seq > st.Seq {
			st.Fold(ev)
			n++
		}
	}
	return n
}

// tailEach reads the events of each partition of lag that is behind,
// past its checkpoint up to its newest event as Lag saw it, and calls fn
// with each one of a node, of a kind the reconciler folds, a partition
// at a time. A partition with more than limit events past its checkpoint is read up
// to limit (complete is then false).
func (r *Reader) tailEach(ctx context.Context, lag SnapshotLag, limit int, fn func(p int, t *store.Tail, x store.Tailed, node string)) (complete bool, err error) {
	_, cfg, err := r.open(ctx)
	if err != nil {
		return false, err
	}
	subj := cfg.Subjects()
	complete = true
	leader := store.Leader(r.js, cfg.Name)
	for _, p := range lag.Behind() {
		// The server may place the read's consumer on a replica behind
		// the leader, whose count of pending messages ends before events
		// the stream acknowledged: the read ends at p.Last, as the
		// leader had it, and short of it only once p.Last is removed (a
		// limit, meanwhile), as JournalWarningSeqs' read does. The
		// consumer's creation rides out a meta leader's election
		// (store.FollowRidingOut).
		t, err := store.FollowRidingOut(ctx, r.js, store.TailConfig{Stream: cfg.Name, Subjects: subj, Filter: subj.StoredPartitionAll(p.Partition), Start: p.Checkpoint + 1})
		if err != nil {
			return false, fmt.Errorf("partition %d past its checkpoint: %w", p.Partition, err)
		}
		err = func() error {
			defer t.Stop()
			if t.Empty() && leader.Removed(ctx, p.Last) {
				return nil // trimmed meanwhile
			}
			for n := 0; ; n++ {
				if n == limit {
					complete = false
					return nil
				}
				x, gone, err := t.NextUpTo(ctx, leader, p.Last)
				if err != nil {
					return err
				}
				if gone {
					return nil // trimmed meanwhile
				}
				seq := x.Meta.Sequence.Stream
				// Only the kinds the reconciler folds: its knocks and
				// journal entries never move a stored state's Seq, so one
				// past the checkpoint says nothing of whether the node's
				// snapshot is behind (a reviewer's finding).
				if node, kind, err := subj.Parse(x.Msg.Subject()); err == nil && node != events.FleetNode && kind.Input() {
					fn(p.Partition, t, x, node)
				}
				if seq >= p.Last || (x.Meta.NumPending == 0 && leader.Removed(ctx, p.Last)) {
					return nil
				}
			}
		}()
		if err != nil {
			return false, fmt.Errorf("partition %d past its checkpoint: %w", p.Partition, err)
		}
	}
	return complete, nil
}

// DefaultTailMax is how many events past a partition's checkpoint a
// reader of the snapshots reads ([Reader.TailNodes]' limit) to find the
// nodes they lag: the reconciler keeps that tail to a few checkpoint
// periods (docs/architecture.md "Live: states put by age").
const DefaultTailMax = 20000

// LaggingNodes returns, sorted, the nodes of tail (each node with events
// past its partition's checkpoint and its newest one's sequence,
// [Reader.TailNodes]) whose stored view is older than that event, or that
// none holds (stored's ok false; seq is the view's Seq): the nodes a
// reader of the snapshots reads live from the reconciler, `meshfold
// fleet`'s table and the console at start alike (a fresh user's finding
// F3: the console showed a node's old want and plan after a serve's kill
// -9 until the node's next event).
func LaggingNodes(tail map[string]uint64, stored func(node string) (seq uint64, ok bool)) []string {
	var out []string
	for node, seq := range tail {
		if have, ok := stored(node); !ok || have < seq {
			out = append(out, node)
		}
	}
	slices.Sort(out)
	return out
}

// LiveView asks the reconciler's state service for node's view alone
// (endpoint state; [RequestState] asks for its composition too).
//
// Errors: as [RequestState].
func (r *Reader) LiveView(ctx context.Context, node string) (reconcile.View, error) {
	var v reconcile.View
	if !events.ValidName(node) {
		return v, &events.FieldError{Field: "node", Value: node, Err: events.ErrBadName}
	}
	timeout := r.c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	err := request(ctx, r.nc, events.StateSubject(r.pre, events.EndpointState, node), timeout, &v)
	return v, err
}

// SnapshotsPast returns, for each of nodes (the nodes of tail, read past
// their partitions' checkpoints by [Reader.TailEvents]), its stored
// snapshot with its events of tail folded in ([FoldPast]): its state as
// the reconciler would have it, for a reader with no reconciler to ask.
// A node no snapshot holds is folded from its events in the stream, as
// [Reader.Stored] does. Nodes are read workers at a time; a node whose
// state could not be read is left out, with why in errs.
//
// Errors: the snapshot bucket's lookup.
func (r *Reader) SnapshotsPast(ctx context.Context, tail Tail, nodes []string, workers int) (states map[string]*reconcile.State, errs map[string]error, err error) {
	snaps, err := r.snapshots(ctx)
	if err != nil && !errors.Is(err, ErrNoSnapshots) {
		return nil, nil, err
	}
	states, errs = make(map[string]*reconcile.State, len(nodes)), map[string]error{}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		next = make(chan string)
	)
	one := func(node string) (*reconcile.State, error) {
		if snaps == nil {
			st, _, err := r.stored(ctx, node)
			return st, err
		}
		data, _, err := snaps.GetNode(ctx, node)
		if errors.Is(err, store.ErrNoSnapshot) {
			st, _, err := r.stored(ctx, node)
			return st, err
		}
		if err != nil {
			return nil, err
		}
		st, err := reconcile.UnmarshalState(data)
		if errors.Is(err, reconcile.ErrSnapshotNewer) {
			st, _, err := r.stored(ctx, node)
			return st, err
		}
		if err != nil {
			return nil, fmt.Errorf("snapshot of %s: %w", node, err)
		}
		FoldPast(st, tail.Events[node])
		return st, nil
	}
	for range max(workers, 1) {
		wg.Go(func() {
			for node := range next {
				st, err := one(node)
				mu.Lock()
				if err != nil {
					errs[node] = err
				} else {
					states[node] = st
				}
				mu.Unlock()
			}
		})
	}
	for _, n := range nodes {
		next <- n
	}
	close(next)
	wg.Wait()
	return states, errs, nil
}
