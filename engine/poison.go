package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/encoding/json"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
)

// poisoned handles an effect that can never be stored (store.Permanent:
// over the server's max_payload, invalid): it is journaled at error,
// shortened, and skipped, and the partition goes on (DESIGN.md §10). Only
// a transient failure restarts a session; retrying this one would restart
// it forever and stop every node of the partition.
//
// The journal entry is published under the effect's own message id, so a
// session that refolds the range reads it as the effect's stand-in and
// does not try again. poisoned appends it at once, unfenced, as the live
// path publishes every effect; a recovery, whose effect subjects are
// fenced, queues it in its journal subject's chain instead
// (poisonEntry; earlyPub.poison, publishFenced).
func (s *session) poisoned(ctx context.Context, e reconcile.Effect, cause error) error {
	x := s.poisonEntry(e, cause)
	if err := s.p.lost(); err != nil {
		return err
	}
	_, err := s.p.r.pub.Append(ctx, x.e.Node, x.e.Payload, store.WithMsgID(store.EffectMsgID(s.p.r.key, x.id)))
	switch {
	case err == nil:
		return nil
	case store.Permanent(err):
		s.poisonLost(x, err)
		return nil
	}
	return fmt.Errorf("journal skipped effect %s: %w", x.id, err)
}

// poisonEntry counts and logs e, an effect that can never be stored
// (cause says why), and returns the journal entry that stands in for it:
// on e's node's journal subject, under e's id (toPublish.poison).
func (s *session) poisonEntry(e reconcile.Effect, cause error) toPublish {
	r := s.p.r
	r.m.Poison.Inc()
	size := 0
	if b, err := events.Encode(e.Payload); err == nil {
		size = len(b)
	}
	r.log.Error("effect can never be stored: journaled and skipped", "node", e.Node, "effect", e.ID(), "bytes", size,
		"err", events.Text(cause.Error()))
	j := &events.Journal{Level: events.LevelError, Cause: e.Cause,
		Msg: fmt.Sprintf("%s %s of %d bytes not stored, skipped: %s", e.Kind, e.ID(), size, events.Text(cause.Error()))}
	events.Stamp(j, events.HeaderOf(e.Payload).At)
	return toPublish{e: reconcile.Effect{Node: e.Node, Kind: events.KindJournal, Cause: e.Cause, N: e.N, Payload: j}, id: e.ID(), poison: true}
}

// poisonLost logs x, a poisoned effect's journal entry, refused too
// (store.Permanent): it is skipped, as its effect was.
func (s *session) poisonLost(x toPublish, err error) {
	s.p.r.log.Error("journal entry of a skipped effect not stored either: skipped", "node", x.e.Node, "effect", x.id, "err", err)
}

// stateMarker is what a node's snapshot key holds instead of a state over
// the server's max_payload: a restart refolds that node from the stream.
type stateMarker struct {
	Node   string `json:"node"`
	Seq    uint64 `json:"seq"`
	TooBig int    `json:"too_big"` // the state's encoded size, bytes
}

// markerOf returns the marker a snapshot holds, ok false for a state.
func markerOf(b []byte) (stateMarker, bool) {
	var m stateMarker
	if json.Unmarshal(b, &m) != nil || m.TooBig <= 0 {
		return stateMarker{}, false
	}
	return m, true
}

// stateRoom is what a node-state put needs beside the state: its headers
// (the expected-sequence fence) and the protocol line.
const stateRoom = 1024

// maxSummary bounds a fleet summary put beside its state: a node with
// more to say (thousands of owed items or failed modules) is read from
// its state, and a reader of every node's headers holds no huge one.
const maxSummary = 64 << 10

// snapshotOf encodes st for the snapshot bucket: the state and its fleet
// summary (reconcile.MarshalSummary, put in the same message:
// store.SummaryHeader), or a marker and no summary when the state is over
// the server's max_payload. A summary over [maxSummary], or that would
// not fit beside its state, is left out (a reader reads the state). The
// first time a node's state is too big in a session (not already a
// marker when the session loaded it), that is journaled at error and
// logged. A state is appended to arena (a checkpoint's states share one
// buffer) and b is its part; arena is returned, grown.
func (s *session) snapshotOf(ctx context.Context, node string, st *reconcile.State, arena []byte) (b, summary, _ []byte, err error) {
	r := s.p.r
	start := len(arena)
	arena, err = reconcile.AppendState(arena, st)
	if err != nil {
		return nil, nil, arena, fmt.Errorf("encode state of %s: %w", node, err)
	}
	size := len(arena) - start
	max := int(r.js.Conn().MaxPayload()) - stateRoom
	if size <= max {
		delete(s.tooBig, node)
		sum, err := reconcile.MarshalSummary(st)
		if err != nil {
			return nil, nil, arena, fmt.Errorf("encode summary of %s: %w", node, err)
		}
		if len(sum) > maxSummary || size+len(store.SummaryHeader)+len(sum)+4 > max {
			sum = nil
		}
		return arena[start:len(arena):len(arena)], sum, arena, nil
	}
	arena = arena[:start] // a marker instead
	r.m.TooBig.Inc()
	if !s.tooBig[node] {
		s.tooBig[node] = true
		msg := fmt.Sprintf("state of %d bytes is over the server's max_payload of %d: its snapshot is a marker, and a restart refolds the node from the stream",
			size, max+stateRoom)
		r.log.Error("node state too big for a snapshot", "node", node, "bytes", size, "max_payload", max+stateRoom)
		j := events.Stamp(&events.Journal{Level: events.LevelError, Msg: msg, Cause: st.Seq}, time.Now())
		if _, err := r.pub.Append(ctx, node, j); err != nil && !store.Permanent(err) {
			return nil, nil, arena, fmt.Errorf("journal the state of %s: %w", node, err)
		}
	}
	b, err = json.Marshal(stateMarker{Node: node, Seq: st.Seq, TooBig: size})
	return b, nil, arena, err
}

// refoldNode rebuilds node's state from its events in the stream up to
// and including sequence upTo: what a marker stands for. The effects are
// dropped: they were carried out when those events were first folded.
func (p *partition) refoldNode(ctx context.Context, node string, upTo uint64) (*reconcile.State, error) {
	r := p.r
	st := reconcile.NewState(node)
	filter := r.subj.StoredNode(node)
	// From the stream's leader: a replica behind it would bound the
	// refold below events the stream holds up to upTo.
	var last *jetstream.RawStreamMsg
	if err := p.leaderRead(ctx, func(ctx context.Context) (err error) {
		last, err = store.Leader(r.js, r.cfg.Stream.Name).GetLastMsgForSubject(ctx, filter)
		return err
	}); err != nil {
		return nil, fmt.Errorf("refold %s: %w", node, err)
	}
	target := min(last.Sequence, upTo)
	if target == 0 {
		return st, nil
	}
	tail, err := store.Follow(ctx, r.js, store.TailConfig{Stream: r.cfg.Stream.Name, Subjects: r.subj, Filter: filter, Heartbeat: readHeartbeat})
	if err != nil {
		return nil, fmt.Errorf("refold %s: %w", node, err)
	}
	defer tail.Stop()
	for {
		m, err := tail.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			return nil, fmt.Errorf("refold %s: %w", node, err)
		}
		seq := m.Event.Seq
		if seq > upTo {
			return st, nil
		}
		if ev := m.Event; ev.Kind != "" && ev.Kind != events.KindKnock && ev.Kind != events.KindJournal {
			st.Fold(ev)
		}
		if seq >= target {
			return st, nil
		}
	}
}
