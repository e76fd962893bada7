package engine

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// fenceRig is a session of a reconciler on one server, whose stream
// refuses messages over maxMsg bytes (0: the stream's default), reading
// from the stream's first message (a first refold), and the reader of
// node ace's messages.
func fenceRig(t *testing.T, maxMsg int32) (*session, func() []store.Msg) {
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{Partitions: 1})
	ctx := t.Context()
	r, err := NewReconciler(ctx, js, ReconcilerConfig{Stream: cfg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if maxMsg > 0 {
		info, err := js.Stream(ctx, cfg.Name)
		if err != nil {
			t.Fatal(err)
		}
		c := info.CachedInfo().Config
		c.MaxMsgSize = maxMsg
		if _, err := js.UpdateStream(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	s := &session{p: &partition{r: r, revoked: t.Context()}, rec: newRecovery(), readAll: true}
	read := func() []store.Msg {
		var out []store.Msg
		if err := store.ReadNode(ctx, js, cfg.Name, cfg.Subjects(), "ace", 0, 0, func(m store.Msg) error {
			out = append(out, m)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	return s, read
}

var fenceAt = time.Date(2026, 12, 2, 22, 0, 0, 0, time.UTC)

// journalEffect is ace's journal effect of cause, its message msg.
func journalEffect(cause uint64, msg string) reconcile.Effect {
	j := events.Stamp(&events.Journal{Level: events.LevelInfo, Msg: msg, Cause: cause}, fenceAt)
	return reconcile.Effect{Node: "ace", Kind: events.KindJournal, Cause: cause, Payload: j}
}

// poisonCases are three effects of ace's, the middle one refused as
// poison: by the client (a plan with no cause is invalid: another
// subject than the journal's) or by the server (a journal entry over the
// stream's maximum message size: the journal subject itself, its entry
// queued behind the next effect).
func poisonCases() map[string]struct {
	maxMsg  int32
	effects []reconcile.Effect
} {
	plan := events.Stamp(&events.Plan{Modules: []events.PlanModule{}}, fenceAt) // no cause: invalid
	return map[string]struct {
		maxMsg  int32
		effects []reconcile.Effect
	}{
		"invalid plan": {0, []reconcile.Effect{journalEffect(1, "first"),
			{Node: "ace", Kind: events.KindPlan, Cause: 2, Payload: plan}, journalEffect(3, "third")}},
		"journal over the stream's limit": {1500, []reconcile.Effect{journalEffect(1, "first"),
			journalEffect(2, strings.Repeat("x", 2500)), journalEffect(3, "third")}},
	}
}

// checkPoisonJournaled: ace's subjects hold the first and third effects
// and the poisoned one's journal entry under its id (after the first: it
// waited for it), each once, and no plan.
func checkPoisonJournaled(t *testing.T, s *session, stored []store.Msg, effects []reconcile.Effect) {
	t.Helper()
	ids := map[string]int{}
	for _, m := range stored {
		if m.Event.Kind != events.KindJournal {
			t.Errorf("a %s stored at %d", m.Event.Kind, m.Event.Seq)
		}
		ids[m.MsgID]++
	}
	if len(stored) != 3 {
		t.Fatalf("%d messages on ace's subjects, want 3", len(stored))
	}
	if id := store.EffectMsgID(s.p.r.key, effects[0].ID()); stored[0].MsgID != id {
		t.Errorf("first message %s, want %s", stored[0].MsgID, id)
	}
	for _, e := range effects {
		if id := store.EffectMsgID(s.p.r.key, e.ID()); ids[id] != 1 {
			t.Errorf("%s stored %d times, want once", e.ID(), ids[id])
		}
	}
	if got := testutil.ToFloat64(s.p.r.m.Poison); got != 1 {
		t.Errorf("poison counted %v times, want 1", got)
	}
}

// TestEarlyPoisonJournaledInItsChain: a first refold publishing as it
// reads journals an effect refused as poison in its node's journal
// subject's chain, fenced, so that subject's next effect is still
// stored (reviewer's finding: an unfenced append there made it fail its
// fence, a restart).
func TestEarlyPoisonJournaledInItsChain(t *testing.T) {
	t.Parallel()
	for name, c := range poisonCases() {
		t.Run(name, func(t *testing.T) {
			s, read := fenceRig(t, c.maxMsg)
			s.early = &earlyPub{on: true, subs: map[effectKey]*earlySubject{}, effects: map[events.Kind]prometheus.Counter{}}
			for _, e := range c.effects {
				s.publishEarly(e)
			}
			if err := s.drainEarly(t.Context()); err != nil {
				t.Fatalf("early publishing past a poison effect: %v", err)
			}
			checkPoisonJournaled(t, s, read(), c.effects)
		})
	}
}

// TestRecoveryPoisonJournaledInItsChain: the same for the effects a
// recovery publishes once its read passed its start (publishFenced).
func TestRecoveryPoisonJournaledInItsChain(t *testing.T) {
	t.Parallel()
	for name, c := range poisonCases() {
		t.Run(name, func(t *testing.T) {
			s, read := fenceRig(t, c.maxMsg)
			for _, e := range c.effects {
				s.rec.deferEffect(e)
			}
			order, queues := s.rec.unpublished()
			if err := s.publishFenced(t.Context(), order, queues); err != nil {
				t.Fatalf("recovery publishing past a poison effect: %v", err)
			}
			checkPoisonJournaled(t, s, read(), c.effects)
		})
	}
}
