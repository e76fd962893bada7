package engine

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// dupRig is a reconciler on a three-server cluster (where the stream
// answers a duplicate message id before checking the publish's fence)
// whose stream already holds a predecessor's copy of the first of two
// journal effects of node ace: what a session racing its predecessor's
// publishes still in flight meets.
func dupRig(t *testing.T) (*session, []reconcile.Effect, func() []store.Msg) {
	_, _, js, _, cfg := storetest.StartClusterStream(t, 3, store.StreamConfig{Partitions: 1, Replicas: 3})
	return effectRig(t, js, cfg, true, "")
}

// effectRig is a session of a reconciler on js's stream (cfg, one
// partition) with two journal effects of node ace, the first's copy
// stored first when copy is set and, when foreign is set, another
// writer's message stored on the subject after it; journal reads ace's
// messages back.
func effectRig(t *testing.T, js jetstream.JetStream, cfg store.StreamConfig, copy bool, foreign string) (*session, []reconcile.Effect, func() []store.Msg) {
	ctx := t.Context()
	r, err := NewReconciler(ctx, js, ReconcilerConfig{Stream: cfg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 2, 14, 0, 0, 0, time.UTC)
	effects := make([]reconcile.Effect, 2)
	for i := range effects {
		j := events.Stamp(&events.Journal{Level: events.LevelInfo, Msg: "effect"}, at)
		effects[i] = reconcile.Effect{Node: "ace", Kind: events.KindJournal, Cause: uint64(i + 1), Payload: j}
	}
	if e := effects[0]; copy {
		if _, err := r.pub.Append(ctx, e.Node, e.Payload, r.publishOpts(e, store.EffectMsgID(r.key, e.ID()))...); err != nil {
			t.Fatal(err)
		}
	}
	if foreign != "" {
		j := events.Stamp(&events.Journal{Level: events.LevelInfo, Msg: foreign}, at)
		if _, err := r.pub.Append(ctx, "ace", j); err != nil {
			t.Fatal(err)
		}
	}
	s := &session{p: &partition{r: r, revoked: context.Background()}, rec: newRecovery(), readAll: true}
	journal := func() []store.Msg {
		var out []store.Msg
		err := store.ReadNode(ctx, js, cfg.Name, cfg.Subjects(), "ace", 0, 0, func(m store.Msg) error {
			out = append(out, m)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	return s, effects, journal
}

// checkJournal: each effect stored once, in order.
func checkJournal(t *testing.T, s *session, stored []store.Msg, effects []reconcile.Effect) {
	t.Helper()
	if len(stored) != len(effects) {
		t.Fatalf("%d messages on ace's subjects, want %d (each effect once)", len(stored), len(effects))
	}
	for i, m := range stored {
		if id := store.EffectMsgID(s.p.r.key, effects[i].ID()); m.MsgID != id {
			t.Fatalf("message %d has id %s, want %s (effect %s)", i, m.MsgID, id, effects[i].ID())
		}
	}
}

// TestEarlyDuplicateMovesTheFence: a first refold publishing as it reads
// whose first effect of a subject is answered as a duplicate (its
// predecessor's copy was stored first) sends the subject's next effect
// behind that copy, rather than behind the fence it had, which the copy
// made stale (a restart).
func TestEarlyDuplicateMovesTheFence(t *testing.T) {
	t.Parallel()
	s, effects, journal := dupRig(t)
	s.early = &earlyPub{on: true, subs: map[effectKey]*earlySubject{}, effects: map[events.Kind]prometheus.Counter{}}
	for _, e := range effects {
		s.publishEarly(e)
	}
	if err := s.drainEarly(t.Context()); err != nil {
		t.Fatalf("early publishing after a duplicate: %v", err)
	}
	checkJournal(t, s, journal(), effects)
}

// TestRecoveryDuplicateMovesTheFence: the same for the effects a
// recovery publishes once its read passed its start (publishFenced).
func TestRecoveryDuplicateMovesTheFence(t *testing.T) {
	t.Parallel()
	s, effects, journal := dupRig(t)
	for _, e := range effects {
		s.rec.deferEffect(e)
	}
	order, queues := s.rec.unpublished()
	if err := s.publishFenced(t.Context(), order, queues); err != nil {
		t.Fatalf("recovery publishing after a duplicate: %v", err)
	}
	checkJournal(t, s, journal(), effects)
}
