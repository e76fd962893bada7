package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
)

// A recovery's fenced effect publishes (publishFenced, earlyPub) ride out
// the loss of the client's server and a stream-leader election as the
// session's leader reads and checkpoint writes do (retry), instead of
// ending the session, whose restart refolds the partition from its
// snapshot (at 100,000 nodes a stall after every loss of the
// reconciler's server: the race run's finding). When the oldest effect in
// flight gets no answer (resendable: the client's server went away, a
// timeout, no responders, a 503, the server's "message id in process"),
// the session waits for the leaders (rideAgain) and sends again, in
// order, every effect still unacknowledged, each with its message id,
// signature and fence unchanged (store.Publisher.ResendAsync), for at
// most electionRideOut without an answer, the lease checked before each
// round. A copy stored before the loss is answered as a duplicate of its
// sequence (a replicated stream checks the message id before the fence),
// which moves the fence (fenceAfter) as for a predecessor's copy; on a
// single replica the server checks the fence first and refuses the copy
// as a conflict, and the session reads the subject's last message from
// the leader: when it carries the effect's own message id, it is the
// copy, taken as a duplicate (conflicted); when it is still the message
// the effect was fenced on, the conflict was stale (a new leader behind
// its predecessor) and the effect is sent again, at most
// staleConflictsMax times. A conflict on any other message still ends
// the session (another writer), a permanent refusal is still poison. docs/architecture.md, "Effect publishes ride out the loss of
// the client's server".

// errNoAck: an effect's publish got no answer within ackTimeout.
var errNoAck = errors.New("engine: no acknowledgement")

// resendable reports whether err, an effect publish's answer or its
// send's refusal, leaves the publish unanswered rather than refused
// (store.Resendable, which the rollout controller's publishes share), or
// is the session's own timeout (errNoAck): it may or may not be stored,
// and sending it again with the same message id and fence is safe; or a
// stale conflict (errStaleConflict): not stored.
func resendable(err error) bool {
	return store.Resendable(err) || errors.Is(err, errNoAck) || errors.Is(err, errStaleConflict)
}

// pubRide is a session's ride-out of unanswered effect publishes: when it
// began (zero: none under way) and the pause between rounds.
type pubRide struct {
	started time.Time
	b       *backoff.ExponentialBackOff
}

// answered ends the ride-out: an effect's publish was answered.
func (ride *pubRide) answered() { ride.started = time.Time{} }

// rideAgain decides, when the oldest of n effects in flight got cause
// (resendable) for an answer, whether to send them again: nil once the
// stream and the snapshot bucket have leaders (awaitLeaders), or after a
// pause (growing from electionPollMin to electionPollMax) when they had
// them all along; cause when the ride-out has lasted electionRideOut
// without an answer or the connection is closed for good; the lease's
// error when the partition's grant is lost.
func (s *session) rideAgain(ctx context.Context, ride *pubRide, cause error, n int) error {
	r := s.p.r
	if ride.started.IsZero() {
		ride.started = time.Now()
		ride.b = backoff.NewExponentialBackOff(backoff.WithInitialInterval(electionPollMin),
			backoff.WithMaxInterval(electionPollMax), backoff.WithMaxElapsedTime(0))
		msg := "effect publishes unanswered: sending them again once the stream answers"
		if errors.Is(cause, errStaleConflict) {
			msg = "an effect publish refused by a stale conflict (a new stream leader behind its predecessor): sending it again once the stream answers"
		}
		r.log.Warn(msg, "partition", s.p.id, "in_flight", n, "err", cause)
	} else if time.Since(ride.started) > electionRideOut {
		return cause
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if wc := r.writes.Conn(); r.js.Conn().IsClosed() || wc.IsClosed() || s.p.noRideOut() && !wc.IsConnected() {
		// Closed for good (either connection: the publishes' or the
		// reads'), or the partition is stopping and its standalone
		// server is gone (noRideOut).
		return cause
	}
	if err := s.p.lost(); err != nil {
		return err
	}
	if !s.p.awaitLeaders(ctx) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(ride.b.NextBackOff()):
		}
	}
	return s.p.lost()
}

// lastOnSubject reads the last message of e's subject (its node, its
// kind) from the stream's leader, riding out an election (leaderRead): a
// replica behind the leader answers an older message, and a publish
// fenced by it fails as a conflict. store.ErrNoMessage: none.
func (s *session) lastOnSubject(ctx context.Context, e reconcile.Effect) (store.Msg, error) {
	r := s.p.r
	var m store.Msg
	err := s.p.leaderRead(ctx, func(ctx context.Context) (err error) {
		m, err = store.LastMsg(ctx, store.Leader(r.js, r.cfg.Stream.Name), r.subj, e.Node, e.Kind)
		return err
	})
	return m, err
}

// errStaleConflict: an effect's publish was refused as a conflict
// (wrong last sequence) while the message it was fenced on was still its
// subject's last on the stream's leader: a new leader that had not yet
// applied what its predecessor committed (stepdowns, nats-server
// v2.15.2; docs/architecture.md, "A publish a deposed leader refuses is
// sent again"). Nothing of it was stored, and its copy under the same
// message id and fence is sent again, as an unanswered publish is.
var errStaleConflict = errors.New("engine: refused as a conflict while its fence was still its subject's last message")

// staleConflictsMax bounds how many times one effect refused by a stale
// conflict is sent again; the next such refusal ends the session, as
// another writer's message does (its restart refolds the partition).
const staleConflictsMax = 3

// conflicted judges answer, the conflict (wrong last sequence) an
// effect e sent under message id id and fenced at fence got, from e's
// subject's last message on the stream's leader:
//   - it carries id: the copy an earlier send stored, refused by the
//     fence before its id was checked (a single replica): an
//     acknowledgement standing for it (a duplicate, of its sequence);
//   - it is the message fenced on (none, for fence 0): a stale conflict,
//     errStaleConflict (resendable) while *stale, the effect's count of
//     them, is under staleConflictsMax, which it counts;
//   - anything else: another writer's message, answer unchanged.
//
// A read that fails returns its error with answer.
func (s *session) conflicted(ctx context.Context, e reconcile.Effect, id string, fence uint64, stale *int, answer error) (*jetstream.PubAck, error) {
	m, err := s.lastOnSubject(ctx, e)
	var last uint64
	switch {
	case errors.Is(err, store.ErrNoMessage):
	case err != nil:
		return nil, fmt.Errorf("%w (reading its subject's last message: %w)", answer, err)
	case m.MsgID == id:
		return &jetstream.PubAck{Stream: s.p.r.cfg.Stream.Name, Sequence: m.Event.Seq, Duplicate: true}, nil
	default:
		last = m.Event.Seq
	}
	if last != fence {
		return nil, answer
	}
	if *stale >= staleConflictsMax {
		return nil, fmt.Errorf("%w (%d times while #%d was its subject's last message)", answer, *stale+1, fence)
	}
	*stale++
	return nil, fmt.Errorf("%w: %w", errStaleConflict, answer)
}

// judged is an effect's answer (ack or err) as the fenced paths take
// it: a conflict is judged (conflicted), anything else is as it came.
func (s *session) judged(ctx context.Context, e reconcile.Effect, id string, fence uint64, stale *int, ack *jetstream.PubAck, err error) (*jetstream.PubAck, error) {
	if err == nil || !errors.Is(store.ServerError(err), store.ErrConflict) {
		return ack, err
	}
	return s.conflicted(ctx, e, id, fence, stale, err)
}

// sends records, for an effect in flight on a fenced path, whether the
// send whose answer is awaited went out (not refused at the client) and
// whether an earlier one did, its answer lost (the ride-out sent the
// effect again). A duplicate answer to a later send is then the copy an
// earlier one stored, this session's: the effect is counted as
// published (meshfold_effects_published_total) and its journal logged
// once, as a first send's acknowledgement is. A duplicate answer to the
// first send that went out is a predecessor's copy, counted by the
// process that sent it. Not told apart: a first send whose own answer,
// lost, was a duplicate of a predecessor's copy (a predecessor's copy
// stored past the session's read and an answer lost, both), counted.
type sends struct {
	out    bool
	before bool
}

// again records that the effect was sent again: out when that send went
// out.
func (c *sends) again(out bool) { c.before, c.out = c.before || c.out, out }

// counts reports whether ack, the effect's answer, counts it as
// published: not a duplicate, or the duplicate of a copy an earlier send
// of this session stored.
func (c sends) counts(ack *jetstream.PubAck) bool { return !ack.Duplicate || c.before }

// sendAgain is store.SendAgain (shared with the rollout controller's
// publishes) for the i-th of the effects in flight when the oldest got
// cause, resendable, for an answer: one still awaited is sent again only
// when cause is the session's timeout (errNoAck).
func sendAgain(i int, cause error, ok <-chan *jetstream.PubAck, errc <-chan error) (bool, <-chan *jetstream.PubAck, <-chan error) {
	return store.SendAgain(i, errors.Is(cause, errNoAck), ok, errc)
}

// failedSend is store.FailedSend.
func failedSend(err error) (<-chan *jetstream.PubAck, <-chan error) { return store.FailedSend(err) }

// injectedAnswer runs the EffectAnswer fault hook, if any, for the
// effect about to be sent under message id id: an error it returns is
// that send's answer, and nothing is sent.
func (s *session) injectedAnswer(id string) error {
	if hook := s.p.r.cfg.Faults.EffectAnswer; hook != nil {
		return hook(s.p.id, id)
	}
	return nil
}

// effectSent runs the AfterEffectSent fault hook, if any.
func (s *session) effectSent(id string) {
	if hook := s.p.r.cfg.Faults.AfterEffectSent; hook != nil {
		hook(s.p.id, id)
	}
}
