package engine

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
)

// staleCopyRig is dupRig with, after the predecessor's copy of the first
// effect, a message of another writer on the subject: a fence read
// since (the subject's last sequence, 2) is later than the copy (1).
func staleCopyRig(t *testing.T) (*session, []reconcile.Effect, func() []store.Msg) {
	s, effects, journal := dupRig(t)
	other := events.Stamp(&events.Journal{Level: events.LevelInfo, Msg: "another writer"}, fenceAt)
	if _, err := s.p.r.pub.Append(t.Context(), "ace", other); err != nil {
		t.Fatal(err)
	}
	return s, effects, journal
}

// checkBehindTheCopy: the copy, the other writer's message, then the
// second effect, stored once.
func checkBehindTheCopy(t *testing.T, s *session, stored []store.Msg, effects []reconcile.Effect) {
	t.Helper()
	if len(stored) != 3 {
		t.Fatalf("%d messages on ace's subjects, want 3", len(stored))
	}
	for i, e := range []int{0, -1, 1} {
		if e < 0 {
			continue
		}
		if id := store.EffectMsgID(s.p.r.key, effects[e].ID()); stored[i].MsgID != id {
			t.Errorf("message %d has id %s, want %s", i, stored[i].MsgID, id)
		}
	}
}

// TestRecoveryDuplicateOlderThanTheFence: a recovery (not from the
// stream's first message) whose first effect of a subject is fenced at
// the subject's last message as the leader has it (2), and answered as
// a duplicate of a copy stored before that (1), fences the subject's
// next effect at 2, the later: at the copy it failed (a restart).
func TestRecoveryDuplicateOlderThanTheFence(t *testing.T) {
	t.Parallel()
	s, effects, journal := staleCopyRig(t)
	s.readAll = false
	for _, e := range effects {
		s.rec.deferEffect(e)
	}
	order, queues := s.rec.unpublished()
	if err := s.publishFenced(t.Context(), order, queues); err != nil {
		t.Fatalf("recovery publishing after a duplicate older than its fence: %v", err)
	}
	checkBehindTheCopy(t, s, journal(), effects)
}

// TestEarlyDuplicateOlderThanTheFence: the same for early publishing,
// its subject's fence set at 2 by hand (a first refold's fences are its
// own acknowledgements, in order, so no run of one meets this).
func TestEarlyDuplicateOlderThanTheFence(t *testing.T) {
	t.Parallel()
	s, effects, journal := staleCopyRig(t)
	s.early = &earlyPub{on: true, subs: map[effectKey]*earlySubject{{"ace", events.KindJournal}: {last: 2}},
		effects: map[events.Kind]prometheus.Counter{}}
	for _, e := range effects {
		s.publishEarly(e)
	}
	if err := s.drainEarly(t.Context()); err != nil {
		t.Fatalf("early publishing after a duplicate older than its fence: %v", err)
	}
	checkBehindTheCopy(t, s, journal(), effects)
}

// TestFenceAfter: the later of the fence and the acknowledgement.
func TestFenceAfter(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		fence, ack, want uint64
		dup              bool
	}{{0, 1, 1, false}, {4, 7, 7, false}, {2, 1, 2, true}, {1, 3, 3, true}} {
		if got := fenceAfter(c.fence, &jetstream.PubAck{Sequence: c.ack, Duplicate: c.dup}); got != c.want {
			t.Errorf("fence %d, ack %d (duplicate %v): %d, want %d", c.fence, c.ack, c.dup, got, c.want)
		}
	}
}
