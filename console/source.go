package console

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
)

// NodeView is one node of the fleet as a [Source] loads it: its view, or
// why it could not be read.
type NodeView struct {
	Node string
	View reconcile.View
	Err  error
}

// Source is where the console reads: everything it shows comes through
// these calls, and none of them writes. [NATSSource] reads a JetStream
// deployment; tests may pass their own.
type Source interface {
	// Fleet returns every node the stored snapshots hold, in no order.
	Fleet(ctx context.Context) ([]NodeView, error)
	// Warnings counts each node's journal entries of level warn or error
	// stored at or after since.
	Warnings(ctx context.Context, since time.Time) (map[string]int, error)
	// Live asks the reconciler for node's current view and composition.
	// Errors: engine.ErrNoReconciler when none answers, engine.ErrUnknownNode.
	Live(ctx context.Context, node string) (reconcile.View, reconcile.Composition, error)
	// History reads node's events in stream order up to end (nil: all).
	// A node with no event is an empty history, not an error.
	History(ctx context.Context, node string, end *audit.Bound) (*audit.History, error)
	// Follow calls fn with every event stored from now on, in stream
	// order, until ctx is done or reading fails.
	Follow(ctx context.Context, fn func(events.Event)) error
}

// NATSSource reads a meshfold stream, its snapshot bucket and the
// reconciler's state service over one NATS connection. Every call is a
// read: it never creates a stream, a bucket or a durable consumer, so the
// operator-read role suffices (store/auth).
type NATSSource struct {
	NC     *nats.Conn
	JS     jetstream.JetStream
	Stream store.StreamConfig
	// Timeout bounds a state-service request (0: 2 s).
	Timeout time.Duration
}

// Fleet implements [Source]: one ordered pass over the snapshot bucket.
// No bucket yet (no reconciler checkpointed) is an empty fleet.
func (s *NATSSource) Fleet(ctx context.Context) ([]NodeView, error) {
	cfg := s.Stream.WithDefaults()
	snaps, err := store.FindSnapshots(ctx, s.JS, cfg)
	if errors.Is(err, store.ErrNoSnapshots) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	var out []NodeView
	err = snaps.LoadAll(ctx, func(node string, data []byte) error {
		st, err := reconcile.UnmarshalState(data)
		if err != nil {
			out = append(out, NodeView{Node: node, Err: err})
			return nil
		}
		out = append(out, NodeView{Node: node, View: st.View()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("console: load snapshots: %w", err)
	}
	return out, nil
}

// Warnings implements [Source] with store.JournalWarnings.
func (s *NATSSource) Warnings(ctx context.Context, since time.Time) (map[string]int, error) {
	return store.JournalWarnings(ctx, s.JS, s.Stream, since)
}

// Live implements [Source] with engine.RequestState.
func (s *NATSSource) Live(ctx context.Context, node string) (reconcile.View, reconcile.Composition, error) {
	t := s.Timeout
	if t == 0 {
		t = 2 * time.Second
	}
	return engine.RequestState(ctx, s.NC, s.Stream.WithDefaults().Prefix, node, t)
}

// errPastBound ends a read at the first event past a time bound.
var errPastBound = errors.New("past the bound")

// History implements [Source] with store.ReadNode (an ordered consumer
// filtered to the node), as `meshfold audit` reads.
func (s *NATSSource) History(ctx context.Context, node string, end *audit.Bound) (*audit.History, error) {
	cfg := s.Stream.WithDefaults()
	var to uint64
	if end != nil && !end.IsTime() {
		to = end.Seq
	}
	var evs []events.Event
	err := store.ReadNode(ctx, s.JS, cfg.Name, cfg.Subjects(), node, 0, to, func(m store.Msg) error {
		if end != nil && end.IsTime() && !m.Event.Time.Before(end.Time.Add(end.Unit)) {
			return errPastBound
		}
		evs = append(evs, m.Event)
		return nil
	})
	if err != nil && !errors.Is(err, errPastBound) {
		return nil, fmt.Errorf("console: %w", err)
	}
	return audit.NewHistory(node, evs)
}

// Follow implements [Source] with a [store.Tail] over the whole stream,
// delivering only what is stored from now on.
func (s *NATSSource) Follow(ctx context.Context, fn func(events.Event)) error {
	cfg := s.Stream.WithDefaults()
	t, err := store.Follow(ctx, s.JS, store.TailConfig{Stream: cfg.Name, Subjects: cfg.Subjects(), New: true})
	if err != nil {
		return fmt.Errorf("console: follow: %w", err)
	}
	defer t.Stop()
	for {
		m, err := t.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("console: follow: %w", err)
		}
		if m.Event.Kind == "" {
			continue // a subject naming no valid node: nothing to show
		}
		fn(m.Event)
	}
}
