package engine

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// singleRig is dupRig on a single replica: there the server checks a
// publish's fence before its message id, so the copy of the first
// effect stored first fails the fence 0 the effect is sent behind
// instead of being answered as a duplicate. With copy false, nothing is
// stored first; foreign, when set, is another writer's message stored
// on the subject.
func singleRig(t *testing.T, copy bool, foreign string) (*session, []reconcile.Effect, func() []store.Msg) {
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{Partitions: 1})
	return effectRig(t, js, cfg, copy, foreign)
}

// TestRecoveryOwnCopyOnASingleReplica: on a single replica, a recovery
// whose first effect of a subject fails its fence on that effect's own
// copy (stored first: a predecessor's, or its own send's whose answer
// was lost) takes the copy for a duplicate (conflicted) and fences the
// subject's next effect behind it. It restarted before.
func TestRecoveryOwnCopyOnASingleReplica(t *testing.T) {
	t.Parallel()
	s, effects, journal := singleRig(t, true, "")
	for _, e := range effects {
		s.rec.deferEffect(e)
	}
	order, queues := s.rec.unpublished()
	if err := s.publishFenced(t.Context(), order, queues); err != nil {
		t.Fatalf("recovery publishing after its own copy: %v", err)
	}
	checkJournal(t, s, journal(), effects)
}

// TestEarlyOwnCopyOnASingleReplica: the same for a first refold
// publishing as it reads.
func TestEarlyOwnCopyOnASingleReplica(t *testing.T) {
	t.Parallel()
	s, effects, journal := singleRig(t, true, "")
	s.early = &earlyPub{on: true, subs: map[effectKey]*earlySubject{}, effects: map[events.Kind]prometheus.Counter{}}
	for _, e := range effects {
		s.publishEarly(e)
	}
	if err := s.drainEarly(t.Context()); err != nil {
		t.Fatalf("early publishing after its own copy: %v", err)
	}
	checkJournal(t, s, journal(), effects)
}

// TestRecoveryConflictStillEnds: another writer's message on the subject
// past the fence is a conflict, as before: the session ends, nothing of
// its is stored.
func TestRecoveryConflictStillEnds(t *testing.T) {
	t.Parallel()
	s, effects, journal := singleRig(t, false, "another writer")
	for _, e := range effects {
		s.rec.deferEffect(e)
	}
	order, queues := s.rec.unpublished()
	err := s.publishFenced(t.Context(), order, queues)
	if !errors.Is(store.ServerError(err), store.ErrConflict) {
		t.Fatalf("recovery publishing behind another writer's message: %v, want a conflict", err)
	}
	if n := len(journal()); n != 1 {
		t.Fatalf("%d messages on ace's subjects, want 1 (the other writer's)", n)
	}
}

// TestResendable pins which answers to an effect's publish are sent
// again (pubride.go) and which are not.
func TestResendable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nats.ErrDisconnected, true},
		{nats.ErrConnectionReconnecting, true},
		{nats.ErrReconnectBufExceeded, true},
		{jetstream.ErrNoStreamResponse, true},
		{jetstream.ErrTooManyStalledMsgs, true},
		{jetstream.ErrAsyncPublishTimeout, true},
		{context.DeadlineExceeded, true},
		{errNoAck, true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10008}, true},
		{&jetstream.APIError{Code: 409, ErrorCode: 10158}, true},
		{&jetstream.APIError{Code: 500, ErrorCode: 10009}, true},
		{&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}, false},
		{&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamMessageExceedsMaximum}, false},
		{nats.ErrConnectionClosed, false},
		{nats.ErrMaxPayload, false},
		{context.Canceled, false},
	} {
		if got := resendable(c.err); got != c.want {
			t.Errorf("resendable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// fakeFuture is a publish's future whose answer the test gives.
type fakeFuture struct {
	msg  *nats.Msg
	ok   chan *jetstream.PubAck
	errc chan error
}

func (f *fakeFuture) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f *fakeFuture) Err() <-chan error            { return f.errc }
func (f *fakeFuture) Msg() *nats.Msg               { return f.msg }

// lostLive returns a live effect of kind on node's subject, sent (its
// message made as publish makes it) and answered with err, or acked.
func lostLive(t *testing.T, s *session, node string, kind events.Kind, cause uint64, err error) pendingAck {
	t.Helper()
	r := s.p.r
	j := events.Stamp(&events.Journal{Level: events.LevelInfo, Msg: "effect"}, time.Date(2026, 12, 3, 7, 0, 0, 0, time.UTC))
	e := reconcile.Effect{Node: node, Kind: kind, Cause: cause, Payload: j}
	data, eerr := events.Encode(j)
	if eerr != nil {
		t.Fatal(eerr)
	}
	m := &nats.Msg{Subject: r.subj.Event(node, kind), Data: data, Header: nats.Header{}}
	m.Header.Set(jetstream.MsgIDHeader, store.EffectMsgID(r.key, e.ID()))
	f := &fakeFuture{msg: m, ok: make(chan *jetstream.PubAck, 1), errc: make(chan error, 1)}
	if err != nil {
		f.errc <- err
	} else {
		f.ok <- &jetstream.PubAck{Sequence: 1}
	}
	return pendingAck{f: f, sent: time.Now(), e: e}
}

// TestLiveResend: the live path's effects left unanswered by the loss of
// the client's server are sent again with their message ids (awaitAcks):
// one whose copy was stored before the loss is answered as a duplicate
// (stored once); a plan behind which a later plan of its node was stored
// is not sent again (never stored after a newer one); the others are.
func TestLiveResend(t *testing.T) {
	t.Parallel()
	s, effects, journal := singleRig(t, true, "")
	ctx := t.Context()
	// effects[0]'s copy is stored: its send is answered "disconnected".
	stored := lostLive(t, s, "ace", events.KindJournal, effects[0].Cause, nats.ErrDisconnected)
	older := lostLive(t, s, "bob", events.KindPlan, 1, nats.ErrDisconnected)
	newer := lostLive(t, s, "bob", events.KindPlan, 2, nil)
	other := lostLive(t, s, "cat", events.KindJournal, 1, nats.ErrDisconnected)
	s.pending = []pendingAck{stored, older, newer, other}
	if err := s.awaitAcks(ctx); err != nil {
		t.Fatalf("awaitAcks after a lost server: %v", err)
	}
	if n := len(journal()); n != 1 {
		t.Errorf("%d messages on ace's subjects, want 1 (the copy, its resend a duplicate)", n)
	}
	r := s.p.r
	stream, err := r.js.Stream(ctx, r.cfg.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.GetLastMsgForSubject(ctx, r.subj.Stored("bob", events.KindPlan)); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("bob's older plan sent again behind a newer one stored (get: %v)", err)
	}
	m, err := stream.GetLastMsgForSubject(ctx, r.subj.Stored("cat", events.KindJournal))
	if err != nil {
		t.Fatalf("cat's effect not sent again: %v", err)
	}
	if id := m.Header.Get(jetstream.MsgIDHeader); id != other.f.Msg().Header.Get(jetstream.MsgIDHeader) {
		t.Errorf("cat's effect stored with id %s", id)
	}
	if len(s.pending) != 0 {
		t.Errorf("%d effects still pending", len(s.pending))
	}
	// ace's copy, answered as a duplicate of its send's, is published
	// once, as cat's is; bob's newer plan was acknowledged, the older
	// never stored.
	for kind, want := range map[events.Kind]float64{events.KindJournal: 2, events.KindPlan: 1} {
		if n := testutil.ToFloat64(r.m.Effects.WithLabelValues(string(kind))); n != want {
			t.Errorf("meshfold_effects_published_total{kind=%q} = %v, want %v", kind, n, want)
		}
	}
}

// TestNotLeaderAnswerResent: a live effect answered "cluster can not
// handle request" (10009: the server it reached no longer leads the
// stream, and stored nothing of it) is sent again with its message id
// and stored once; before, the answer ended the session (a refold of
// its partition). The answer is injected: the nats-server of go.mod does
// not send it (docs/architecture.md, "A publish a deposed leader refuses
// is sent again").
func TestNotLeaderAnswerResent(t *testing.T) {
	t.Parallel()
	s, _, _ := singleRig(t, false, "")
	ctx := t.Context()
	notLeader := &jetstream.APIError{Code: 500, ErrorCode: 10009, Description: "JetStream cluster can not handle request"}
	lost := lostLive(t, s, "cat", events.KindJournal, 1, notLeader)
	s.pending = []pendingAck{lost}
	if err := s.awaitAcks(ctx); err != nil {
		t.Fatalf("awaitAcks after a 10009 answer: %v", err)
	}
	r := s.p.r
	stream, err := r.js.Stream(ctx, r.cfg.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.GetLastMsgForSubject(ctx, r.subj.Stored("cat", events.KindJournal))
	if err != nil {
		t.Fatalf("cat's effect not sent again: %v", err)
	}
	if id := m.Header.Get(jetstream.MsgIDHeader); id != lost.f.Msg().Header.Get(jetstream.MsgIDHeader) {
		t.Errorf("cat's effect stored with id %s", id)
	}
	if n := testutil.ToFloat64(r.m.Effects.WithLabelValues(string(events.KindJournal))); n != 1 {
		t.Errorf("meshfold_effects_published_total{kind=journal} = %v, want 1", n)
	}
}

// TestResentOwnCopyCounts: a fenced effect whose first send was stored
// and its answer lost (the client's connection dropped right after the
// send: every answer pending is "disconnected"), sent again and answered
// as its own copy's duplicate (conflicted, on a single replica), counts as
// published once, as a first send's acknowledgement does
// (meshfold_effects_published_total); it was not counted. Recovery and
// first-refold publishing both; the live path in TestLiveResend.
func TestResentOwnCopyCounts(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"recovery", "early"} {
		t.Run(path, func(t *testing.T) {
			// The drop must come before the answer: the hook runs as
			// soon as the send returns, well before the server's
			// answer as a rule; a run where the answer came first
			// (no ride-out) proves nothing and is run again.
			for attempt := 1; ; attempt++ {
				if resentOwnCopyCounts(t, path) {
					return
				}
				if attempt == 5 {
					t.Fatal("the first send's answer came before every connection drop: no resend")
				}
			}
		})
	}
}

// resentOwnCopyCounts runs TestResentOwnCopyCounts's case once; false
// when the first send's answer came before the connection's drop.
func resentOwnCopyCounts(t *testing.T, path string) bool {
	s, effects, journal := singleRig(t, false, "")
	r := s.p.r
	rode := make(chan struct{})
	var once sync.Once
	r.log = slog.New(&onMessage{msg: "effect publishes unanswered", do: func() { once.Do(func() { close(rode) }) }})
	var dropped atomic.Bool
	r.cfg.Faults.AfterEffectSent = func(int, string) {
		if dropped.CompareAndSwap(false, true) {
			if err := r.js.Conn().ForceReconnect(); err != nil {
				t.Error(err)
			}
		}
	}
	ctx := t.Context()
	var err error
	if path == "recovery" {
		for _, e := range effects {
			s.rec.deferEffect(e)
		}
		order, queues := s.rec.unpublished()
		err = s.publishFenced(ctx, order, queues)
	} else {
		s.early = &earlyPub{on: true, subs: map[effectKey]*earlySubject{}, effects: map[events.Kind]prometheus.Counter{}}
		for _, e := range effects {
			s.publishEarly(e)
		}
		err = s.drainEarly(ctx)
	}
	if err != nil {
		t.Fatalf("%s publishing after a lost answer: %v", path, err)
	}
	select {
	case <-rode:
	default:
		return false
	}
	checkJournal(t, s, journal(), effects)
	if n := testutil.ToFloat64(r.m.Effects.WithLabelValues(string(events.KindJournal))); n != float64(len(effects)) {
		t.Errorf("meshfold_effects_published_total{kind=journal} = %v, want %d (each effect once)", n, len(effects))
	}
	return true
}

// onMessage is a log handler that calls do for each record whose
// message starts with msg.
type onMessage struct {
	msg string
	do  func()
}

func (h *onMessage) Enabled(context.Context, slog.Level) bool { return true }
func (h *onMessage) Handle(_ context.Context, rec slog.Record) error {
	if strings.HasPrefix(rec.Message, h.msg) {
		h.do()
	}
	return nil
}
func (h *onMessage) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *onMessage) WithGroup(string) slog.Handler      { return h }

// TestSendsCount pins which answers count an effect as published: any
// acknowledgement but a duplicate, and a duplicate only when an earlier
// send of this session went out unanswered (its copy).
func TestSendsCount(t *testing.T) {
	t.Parallel()
	dup, fresh := &jetstream.PubAck{Duplicate: true}, &jetstream.PubAck{}
	first := sends{out: true}
	resent := first
	resent.again(true)
	unsentFirst := sends{}
	unsentFirst.again(true)
	refusedAgain := first
	refusedAgain.again(false)
	refusedAgain.again(true)
	for _, c := range []struct {
		name  string
		s     sends
		ack   *jetstream.PubAck
		count bool
	}{
		{"first send acknowledged", first, fresh, true},
		{"first send a duplicate (a predecessor's copy)", first, dup, false},
		{"sent again, a duplicate (its own copy)", resent, dup, true},
		{"sent again, acknowledged", resent, fresh, true},
		{"first send refused at the client, then a duplicate", unsentFirst, dup, false},
		{"a resend refused at the client, then a duplicate", refusedAgain, dup, true},
	} {
		if got := c.s.counts(c.ack); got != c.count {
			t.Errorf("%s: counts %v, want %v", c.name, got, c.count)
		}
	}
}

// TestSendAgain pins which effects in flight are sent again when the
// oldest is unanswered: the oldest; one answered "disconnected" too; one
// still awaited only after a timeout; an answer arrived is kept.
func TestSendAgain(t *testing.T) {
	t.Parallel()
	answer := func(ack *jetstream.PubAck, err error) (<-chan *jetstream.PubAck, <-chan error) {
		ok, errc := make(chan *jetstream.PubAck, 1), make(chan error, 1)
		if ack != nil {
			ok <- ack
		}
		if err != nil {
			errc <- err
		}
		return ok, errc
	}
	inProcess := &jetstream.APIError{Code: 409, ErrorCode: 10158}
	conflict := &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}
	for _, c := range []struct {
		name      string
		i         int
		cause     error
		ack       *jetstream.PubAck
		err       error
		want      bool
		wantAck   bool
		wantError error
	}{
		{"the oldest", 0, inProcess, nil, nil, true, false, nil},
		{"awaited, the oldest in process", 1, inProcess, nil, nil, false, false, nil},
		{"awaited, the oldest timed out", 1, errNoAck, nil, nil, true, false, nil},
		{"disconnected too", 1, nats.ErrDisconnected, nil, nats.ErrDisconnected, true, false, nil},
		{"acknowledged meanwhile", 1, errNoAck, &jetstream.PubAck{Sequence: 7}, nil, false, true, nil},
		{"refused meanwhile", 1, errNoAck, nil, conflict, false, false, conflict},
	} {
		ok, errc := answer(c.ack, c.err)
		got, ok2, errc2 := sendAgain(c.i, c.cause, ok, errc)
		if got != c.want {
			t.Errorf("%s: sent again %v, want %v", c.name, got, c.want)
			continue
		}
		if c.wantAck {
			if a := <-ok2; a == nil || a.Sequence != 7 {
				t.Errorf("%s: the acknowledgement kept is %+v", c.name, a)
			}
		}
		if c.wantError != nil {
			if err := <-errc2; !errors.Is(err, c.wantError) {
				t.Errorf("%s: the answer kept is %v", c.name, err)
			}
		}
	}
}
