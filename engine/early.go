package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
)

// earlyPub is a first refold's publishing during its read (issue 27,
// docs/architecture.md "A first refold publishes as it reads"). A session
// that reads its partition from the stream's first message asks the
// stream, at its start, whether it holds any effect message (plan, knock,
// journal) of the partition (holdsEffects). When it holds none, no effect
// the fold makes can be found stored by the recovery rule, which would
// publish every one of them after the read, each subject's in order
// behind fence 0 and then its previous effect's sequence. Once they are
// dense enough to pay for it (probe), earlyPub publishes them during the
// read instead, with the same fences: each
// subject's effects in the order folded, each sent once the one before it
// is acknowledged, fenced behind that acknowledgement's sequence (0 for
// the first). A message another writer stores on the subject meanwhile
// fails the expectation, and the session restarts; its successor finds
// the partition holding effects and defers them, as every recovery did.
//
// It never blocks the read: an effect whose subject has one in flight
// waits in the subject's queue, and acknowledgements are taken, in the
// order sent, as each message is handled (pump). Everything it holds is
// published and acknowledged before a checkpoint and when the recovery
// ends (drainEarly), so such a refold may checkpoint before its end
// (recoveryCheckpointDue), where one that defers its effects cannot.
type earlyPub struct {
	// on holds once the session publishes as it reads: from its start
	// it defers, as every recovery does, until the effects deferred
	// reach earlyDensity of the messages handled (after earlyProbe),
	// and then moves them into the subjects' queues (probe).
	on   bool
	subs map[effectKey]*earlySubject
	// ready holds the subjects whose next effect may be sent (none of
	// theirs in flight, one queued), in turn.
	ready []effectKey
	// inflight holds the effects sent and not yet acknowledged, in the
	// order sent: one stream acknowledges in that order.
	inflight []earlySent
	effects  map[events.Kind]prometheus.Counter
	// ride is the ride-out of unanswered publishes under way (pubride.go).
	ride pubRide
}

// earlySubject is an effect subject earlyPub publishes to.
type earlySubject struct {
	// last is the sequence its last effect was stored at: the fence of
	// its next (0: none yet, the subject holds nothing).
	last uint64
	// busy holds while one of its effects is in flight.
	busy bool
	// queue holds its effects folded and not yet sent, in order, and on
	// a journal subject the entries standing in for effects refused as
	// poison (poison); prep is the first one's message once prepared (a
	// send the connection's pending limit refused is sent again as it
	// was prepared).
	queue []toPublish
	prep  *store.Prepared
	id    string // prep's message id
}

// earlySent is an effect earlyPub sent and has no answer for yet.
type earlySent struct {
	k     effectKey
	x     toPublish
	id    string // the message id
	fence uint64
	pm    *store.Prepared // the message, to send again (pubride.go)
	ok    <-chan *jetstream.PubAck
	errc  <-chan error
	at    time.Time
	sends sends
	stale int        // its stale conflicts (conflicted)
	span  trace.Span // its publish's, when tracing (recoveryTrace)
}

// earlyWindow bounds the effects earlyPub has in flight in one session:
// sixteen sessions' stay below the client's default 4,000 pending
// asynchronous publishes, which every session of the process shares.
const earlyWindow = 200

// holdsEffects reports whether the stream holds any effect message
// (plan, knock, journal) of partition p: three gets of the last message
// on a wildcard subject, from the stream's leader (store.LeaderReads): a
// replica behind it may not have applied the effects a reconciler that
// stopped a moment ago stored.
func (p *partition) holdsEffects(ctx context.Context) (bool, error) {
	r := p.r
	leader := store.Leader(r.js, r.cfg.Stream.Name)
	for _, f := range r.subj.StoredPartition(p.id, events.EffectKinds...) {
		_, err := leader.GetLastMsgForSubject(ctx, f)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("effects of partition %d: %w", p.id, err)
		}
		return true, nil
	}
	return false, nil
}

// heldAsk is holdsEffects asked from the leader on a goroutine of its
// own (askHoldsEffects): beside the session's consumer creation rather
// than before it, one round trip fewer on a cold session's start, and at
// 100,000 nodes the server's walk over the partition's subjects (the
// wildcard get matches every node's, ~6,250 a partition) off that path
// (issue 27, a cold refold's fixed costs). held and err are written by
// the goroutine, read once done is closed.
type heldAsk struct {
	cancel context.CancelFunc
	done   chan struct{}
	held   bool
	err    error
}

// askHoldsEffects starts holdsEffects, a leader read that rides out an
// election (leaderRead), under ctx; stop ends it and waits for it.
func (p *partition) askHoldsEffects(ctx context.Context) *heldAsk {
	ctx, cancel := context.WithCancel(ctx)
	a := &heldAsk{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		a.err = p.leaderRead(ctx, func(ctx context.Context) (err error) {
			a.held, err = p.holdsEffects(ctx)
			return err
		})
	}()
	return a
}

// stop ends the ask, if still under way, and waits for its goroutine: it
// never outlives its session.
func (a *heldAsk) stop() {
	a.cancel()
	<-a.done
}

// takeHeld waits for the answer of the session's holdsEffects ask, if it
// made one, before the session handles its first message: with none of
// the partition's effects stored, the session publishes as it reads
// (earlyPub), as when it asked before making its consumer. The ask's
// error (its context's, once the session's ends) is the session's.
func (s *session) takeHeld() error {
	a := s.held
	if a == nil {
		return nil
	}
	s.held = nil
	<-a.done
	if a.err != nil {
		return a.err
	}
	if !a.held {
		s.early = &earlyPub{subs: map[effectKey]*earlySubject{}, effects: map[events.Kind]prometheus.Counter{}}
	}
	return nil
}

// earlyProbe and earlyDensity: a first refold publishes as it reads once
// it has handled earlyProbe messages and deferred at least one effect
// for every earlyDensity of them. Publishing as it reads cost a sparse
// refold more than it saved: on the bench's mix (5 effects in 100
// inputs) the reconciler's CPU an event rose 10-30 % and the server's
// 20-50 %, each effect sent alone while the partitions read; on the
// effect-dense mix (31 in 100), where publishing after the read was half
// the refold, neither rose (docs/benchmarks.md).
const (
	earlyProbe   = 1024
	earlyDensity = 8
)

// probe starts publishing as the session reads when its deferred effects
// are dense enough (earlyProbe, earlyDensity) and none was seen stored.
func (s *session) probe() {
	ep := s.early
	if ep.on || s.n < earlyProbe || uint64(len(s.rec.deferred))*earlyDensity < s.n || s.rec.unstored != nil {
		return
	}
	ep.on = true
	for _, d := range s.rec.deferred {
		ep.enqueue(d)
	}
	s.rec.deferred = nil
}

// publishEarly takes e, an effect folded while recovering: with early
// publishing on, it is queued behind its subject's effects and sent by
// pump; without (false), the caller defers it.
func (s *session) publishEarly(e reconcile.Effect) bool { return s.publishEarlyCaused(e, "") }

// publishEarlyCaused is publishEarly of e whose cause carried
// traceparent tp (kept while tracing).
func (s *session) publishEarlyCaused(e reconcile.Effect, tp string) bool {
	ep := s.early
	if ep == nil || !ep.on {
		return false
	}
	ep.enqueue(toPublish{e: e, id: e.ID(), tp: tp})
	return true
}

// enqueue queues x behind its subject's effects; the subject is ready
// when x is first and none of its effects is in flight.
func (ep *earlyPub) enqueue(x toPublish) {
	k := effectKey{x.e.Node, x.e.Kind}
	sub := ep.subs[k]
	if sub == nil {
		sub = &earlySubject{}
		ep.subs[k] = sub
	}
	sub.queue = append(sub.queue, x)
	if !sub.busy && len(sub.queue) == 1 {
		ep.ready = append(ep.ready, k)
	}
}

// poison journals e, refused as poison (cause), in its node's journal
// subject's chain: its entry (poisonEntry) is queued there, so it is sent
// once that subject's effect in flight is acknowledged, fenced behind the
// subject's last sequence, and moves the fence to its own. An unfenced
// append there made the subject's next effect, fenced behind its last
// acknowledged one, fail (a restart: reviewer's finding); moving the
// fence past an unfenced append would hide a second writer's message
// stored before it. Call it with e's subject ready again when it has
// more queued (the journal subject may be e's own).
func (s *session) earlyPoison(e reconcile.Effect, cause error) {
	s.early.enqueue(s.poisonEntry(e, cause))
}

// pump takes the acknowledgements already arrived, without waiting, and
// sends the effects they (and the fold) made ready.
func (s *session) pump(ctx context.Context) error {
	if len(s.early.inflight) == 0 && len(s.early.ready) == 0 {
		return nil
	}
	if err := s.earlyAnswers(ctx, false); err != nil {
		return err
	}
	return s.earlySends(ctx)
}

// drainEarly publishes every effect earlyPub holds and waits for each
// acknowledgement: before a checkpoint, and when the recovery ends.
func (s *session) drainEarly(ctx context.Context) error {
	defer s.enter(&stepEarly)()
	ep := s.early
	for len(ep.inflight) > 0 || len(ep.ready) > 0 {
		if err := s.earlySends(ctx); err != nil {
			return err
		}
		if len(ep.inflight) > 0 {
			if err := s.earlyAnswers(ctx, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// earlySends sends the next effect of every ready subject, at most
// earlyWindow in flight; a send the connection's pending limit refuses
// is left ready for the next call.
func (s *session) earlySends(ctx context.Context) error {
	r, ep := s.p.r, s.early
	for len(ep.ready) > 0 && len(ep.inflight) < earlyWindow {
		k := ep.ready[0]
		sub := ep.subs[k]
		x := sub.queue[0]
		var err error
		if sub.prep == nil {
			sub.id = store.EffectMsgID(r.key, x.id)
			sub.prep, err = r.pub.Prepare(ctx, x.e.Node, x.e.Payload, r.publishOpts(x.e, sub.id)...)
		}
		if err := s.p.lost(); err != nil {
			return err
		}
		var f jetstream.PubAckFuture
		var span trace.Span
		var injected error
		if err == nil {
			span = s.rt.publishing(x, sub.id, sub.prep)
			if injected = s.injectedAnswer(sub.id); injected == nil {
				f, err = r.pub.SendAsync(sub.prep, true, sub.last)
			}
		}
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) && ctx.Err() == nil {
			s.rt.stalled(sub.id, span)
			return nil // backpressure: sent again on the next call
		}
		ep.ready = ep.ready[1:]
		id, pm := sub.id, sub.prep
		sub.queue, sub.prep, sub.id = sub.queue[1:], nil, ""
		if store.Permanent(err) {
			s.rt.answered(span, nil, err)
			if len(sub.queue) > 0 {
				ep.ready = append(ep.ready, k)
			}
			if x.poison {
				s.poisonLost(x, err)
			} else {
				s.earlyPoison(x.e, err)
			}
			continue
		}
		sx := earlySent{k: k, x: x, id: id, fence: sub.last, pm: pm, at: time.Now(), span: span}
		switch {
		case injected != nil:
			sx.ok, sx.errc = failedSend(injected)
			sx.sends.out = true
		case err == nil:
			s.remember(f.Msg())
			sx.ok, sx.errc = f.Ok(), f.Err()
			sx.sends.out = true
			s.effectSent(id)
		case resendable(err) && pm != nil:
			sx.ok, sx.errc = failedSend(err) // sent again in its turn
		default:
			s.rt.answered(span, nil, err)
			return fmt.Errorf("publish %s (fenced at %d): %w", id, sub.last, err)
		}
		sub.busy = true
		ep.inflight = append(ep.inflight, sx)
	}
	return nil
}

// earlyAgain sends the effects earlyPub has in flight again (those
// sendAgain picks), in order, once the oldest got cause (resendable) for
// an answer and the ride-out allows it (rideAgain); as publishFenced's
// again.
func (s *session) earlyAgain(ctx context.Context, cause error) error {
	ep := s.early
	x := ep.inflight[0]
	if err := s.rideAgain(ctx, &ep.ride, fmt.Errorf("publish %s (fenced at %d): %w", x.id, x.fence, cause), len(ep.inflight)); err != nil {
		return err
	}
	var refused error
	for i := range ep.inflight {
		x := &ep.inflight[i]
		var resend bool
		if resend, x.ok, x.errc = sendAgain(i, cause, x.ok, x.errc); !resend {
			continue
		}
		if refused == nil {
			if injected := s.injectedAnswer(x.id); injected != nil {
				x.ok, x.errc = failedSend(injected)
				x.sends.again(true)
				continue
			}
			var f jetstream.PubAckFuture
			if f, refused = s.p.r.pub.ResendAsync(x.pm, true, x.fence); refused == nil {
				x.ok, x.errc = f.Ok(), f.Err()
				x.sends.again(true)
				continue
			}
		}
		x.ok, x.errc = failedSend(refused)
		x.sends.again(false)
	}
	return nil
}

// earlyAnswers takes the answers to the effects in flight, in the order
// sent, as long as they have arrived; with wait, it first waits for the
// oldest one's (each wait bounded by ackTimeout). An unanswered publish
// sends every effect in flight again (earlyAgain); with wait, the wait
// goes on for the oldest one's answer.
func (s *session) earlyAnswers(ctx context.Context, wait bool) error {
	ep := s.early
	var timer *time.Timer
	for len(ep.inflight) > 0 {
		x := ep.inflight[0]
		var (
			ack *jetstream.PubAck
			err error
		)
		select {
		case ack = <-x.ok:
		case err = <-x.errc:
		default:
			if !wait {
				return nil
			}
			if timer == nil {
				timer = time.NewTimer(ackTimeout)
				defer timer.Stop()
			} else {
				timer.Reset(ackTimeout)
			}
			var werr error
			if ack, err, werr = s.awaitAck(ctx, x.ok, x.errc, timer); werr != nil {
				return werr
			}
		}
		ack, err = s.judged(ctx, x.x.e, x.id, x.fence, &ep.inflight[0].stale, ack, err)
		if err != nil && resendable(err) {
			if err := s.earlyAgain(ctx, err); err != nil {
				return err
			}
			continue // with wait, the oldest one's answer again
		}
		ep.ride.answered()
		wait = false
		ep.inflight = ep.inflight[1:]
		if err := s.earlyAnswered(ctx, x, ack, err); err != nil {
			return err
		}
	}
	return nil
}

// earlyAnswered takes x's acknowledgement (or error): its subject's fence
// moves to the sequence it was stored at, and its next effect is ready.
func (s *session) earlyAnswered(ctx context.Context, x earlySent, ack *jetstream.PubAck, err error) error {
	r, ep := s.p.r, s.early
	s.rt.answered(x.span, ack, err)
	sub := ep.subs[x.k]
	sub.busy = false
	if len(sub.queue) > 0 {
		ep.ready = append(ep.ready, x.k)
	}
	switch {
	case err != nil:
		err = store.ServerError(err)
		if !store.Permanent(err) {
			return fmt.Errorf("publish %s (fenced at %d): %w", x.id, x.fence, err)
		}
		if x.x.poison {
			s.poisonLost(x.x, err)
		} else {
			s.earlyPoison(x.x.e, err)
		}
	default:
		r.m.Publishing.Observe(time.Since(x.at).Seconds())
		// A duplicate is this effect's copy a predecessor stored (on a
		// replicated stream the server answers it before the fence):
		// the subject's next effect follows it all the same, or the
		// fence, whichever is later (fenceAfter).
		sub.last = fenceAfter(x.fence, ack)
		if x.sends.counts(ack) && !x.x.poison {
			c, ok := ep.effects[x.x.e.Kind]
			if !ok {
				c = r.m.Effects.WithLabelValues(string(x.x.e.Kind))
				ep.effects[x.x.e.Kind] = c
			}
			c.Inc()
			r.logJournal(x.x.e)
		}
	}
	return nil
}
