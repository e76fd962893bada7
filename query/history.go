package query

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/store"
)

// Bounds bound a history read. A history is always read from the node's
// first event: every view of it (a state as of a bound, a why-chain) is
// a fold from the beginning.
type Bounds struct {
	// Until ends the read at the node's last event at or before it: a
	// sequence bound stops the consumer there, a time bound at the first
	// event after the unit the time is written in (audit.Bound). nil
	// reads every event stored now.
	Until *audit.Bound
}

// errPastBound ends a read at the first event past a time bound.
var errPastBound = errors.New("query: past the bound")

// History reads node's events in stream order with an ordered consumer
// filtered to the node (store.ReadNode: other nodes' events are never
// fetched), within b. A read with an Until bound is partial
// (audit.History.Partial): the node may have later events, and the
// history's notes never say a bound is after its last event. A node with
// no event is an empty history, not an error; a bounded read that ends
// before the node's first event is empty too, with that event in
// audit.History.First.
//
// Errors: a bad node name (matching events.ErrInvalid); the stream's
// lookup errors (store.ErrNoStream); the read's errors.
func (r *Reader) History(ctx context.Context, node string, b Bounds) (*audit.History, error) {
	if !events.ValidName(node) {
		return nil, &events.FieldError{Field: "node", Value: node, Err: events.ErrBadName}
	}
	stream, cfg, err := r.open(ctx)
	if err != nil {
		return nil, err
	}
	subj := cfg.Subjects()
	end := b.Until
	total := 0
	var progress func(done, total int)
	if r.c.Progress != nil {
		// The node's message count, per kind, from the stream's subject
		// index: one request, no message read.
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subj.StoredNode(node)))
		if err != nil {
			return nil, fmt.Errorf("stream info: %w", err)
		}
		for _, n := range info.State.Subjects {
			total += int(n)
		}
		if total > ProgressThreshold {
			progress = func(done, total int) { r.c.Progress(node, done, total) }
		}
	}
	var to uint64
	if end != nil && !end.IsTime() {
		to = end.Seq
	}
	var evs []events.Event
	var steps map[uint64]audit.RolloutStep
	if total > 0 {
		evs = make([]events.Event, 0, total)
	}
	err = store.ReadNode(ctx, r.js, cfg.Name, subj, node, 0, to, func(m store.Msg) error {
		if end != nil && end.IsTime() && !m.Event.Time.Before(end.Time.Add(end.Unit)) {
			return errPastBound
		}
		evs = append(evs, m.Event)
		if st, ok := rolloutStep(node, m); ok {
			if steps == nil {
				steps = map[uint64]audit.RolloutStep{}
			}
			steps[m.Event.Seq] = st
		}
		if progress != nil && (len(evs)%1000 == 0 || len(evs) == total) {
			progress(len(evs), total)
		}
		return nil
	})
	if progress != nil {
		progress(-1, total) // done: clear the bar
	}
	if err != nil && !errors.Is(err, errPastBound) {
		return nil, err
	}
	h, err := audit.NewHistory(node, evs)
	if err != nil {
		return nil, err
	}
	// Read up to a bound: later events are not known to be absent.
	h.Partial = end != nil
	if end != nil && len(evs) == 0 {
		// Nothing at or before the bound: the node may still have
		// events after it, and its first one tells the two apart
		// (a node with no events at all is a mistyped name).
		err = store.ReadNode(ctx, r.js, cfg.Name, subj, node, 0, 0, func(m store.Msg) error {
			ev := m.Event
			h.First = &ev
			return errPastBound
		})
		if err != nil && !errors.Is(err, errPastBound) {
			return nil, err
		}
	}
	h.Rollout = steps
	return h, nil
}

// rolloutStep reads the rollout step that published a want of node from
// the message's id (rollout.WantID) and why header (rollout.HeaderWhy);
// false for any other message.
func rolloutStep(node string, m store.Msg) (audit.RolloutStep, bool) {
	if m.Event.Kind != events.KindWant || m.MsgID == "" {
		return audit.RolloutStep{}, false
	}
	fleet, id, n, step, ok := rollout.ParseWantID(m.MsgID)
	if !ok || n != node {
		return audit.RolloutStep{}, false
	}
	return audit.RolloutStep{Fleet: fleet, Rollout: id, Step: string(step), Why: events.ErrorText(m.Header.Get(rollout.HeaderWhy))}, true
}

// Begins says where h's node's history begins when the stream no longer
// holds its first events (trimmed by its age or size limit): "" when the
// stream still begins at sequence 1, h is empty, or the stream's state
// cannot be read.
func (r *Reader) Begins(ctx context.Context, h *audit.History) string {
	if len(h.Events) == 0 {
		return ""
	}
	stream, _, err := r.open(ctx)
	if err != nil {
		return ""
	}
	info, err := stream.Info(ctx)
	if err != nil || info.State.FirstSeq <= 1 {
		return ""
	}
	first := h.Events[0]
	return fmt.Sprintf("the stream begins at sequence %d (%s): earlier events aged out, so %s's history here begins at #%d (%s) and its state may rest on events no longer shown",
		info.State.FirstSeq, info.State.FirstTime.UTC().Format(time.RFC3339), h.Node, first.Seq, first.Time.UTC().Format(time.RFC3339))
}

// Count returns how many events of node the stream holds (its subject
// index: one request, no message read); 0 is a node nothing is known
// of, which a verb naming it refuses unless told it is new (issue 25).
//
// Errors: the stream's lookup and info errors.
func (r *Reader) Count(ctx context.Context, node string) (int, error) {
	stream, cfg, err := r.open(ctx)
	if err != nil {
		return 0, err
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(cfg.Subjects().StoredNode(node)))
	if err != nil {
		return 0, fmt.Errorf("stream info: %w", err)
	}
	n := 0
	for _, c := range info.State.Subjects {
		n += int(c)
	}
	return n, nil
}

// StreamBegins returns the stream's first sequence and its time: every
// event before it aged out (the stream's max-age or size limits) or was
// deleted; 1 when none did.
//
// Errors: the stream's lookup and info errors.
func (r *Reader) StreamBegins(ctx context.Context) (uint64, time.Time, error) {
	stream, _, err := r.open(ctx)
	if err != nil {
		return 0, time.Time{}, err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("stream info: %w", err)
	}
	return info.State.FirstSeq, info.State.FirstTime, nil
}
