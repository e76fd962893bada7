package store

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Backoff returns the roles' retry pacing: initial, doubling up to max,
// ±50 % jitter, and no time limit (the caller's context bounds it).
func Backoff(initial, max time.Duration) *backoff.ExponentialBackOff {
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(initial),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0.5),
		backoff.WithMaxInterval(max),
		backoff.WithMaxElapsedTime(0),
	)
}

// Retry runs op, paced by b, until it succeeds, fails permanently (an
// error made with backoff.Permanent) or ctx is done, and logs each retry
// at warn ("<what> failed; retrying").
//
// Errors: op's permanent error; op's last error once ctx is done.
func Retry[T any](ctx context.Context, log *slog.Logger, what string, b backoff.BackOff, op func() (T, error)) (T, error) {
	return backoff.RetryNotifyWithData(op, backoff.WithContext(b, ctx), func(err error, d time.Duration) {
		log.Warn(what+" failed; retrying", "in", d.Round(time.Millisecond), "err", err)
	})
}

// Unanswered reports whether err says a JetStream request got no answer
// from the leader it needs, which a leader elected, or a server
// reconnected to, gives later: the server's 503 ("JetStream system
// temporarily unavailable": the stream's group, or the cluster's
// metadata, has no leader now; any 503 reply), no responders, no stream
// response, a timeout (nats.ErrTimeout, context.DeadlineExceeded), or
// the connection disconnected or reconnecting (its server went away: the
// client connects to another), or an asynchronous publish's answer not
// come within the JetStream context's publish-async timeout
// (jetstream.ErrAsyncPublishTimeout: the leader that had it may be gone).
// A refusal (not found, denied, a bad
// request, a conflict) and a closed connection are not: asking again
// gets the same. [LeaderReads] rides these out within its deadline; the
// reconciler's writes and reads ride them out for an election's length.
func Unanswered(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, jetstream.ErrAsyncPublishTimeout) || (errors.As(err, &apiErr) && apiErr.Code == 503)
}

// ErrNoLeader matches the error [RideOut], [AskAgain] and
// [LeaderReads] give up with when their asks went unanswered, or were
// answered "no leader", until the caller's deadline ([NoLeaderError]):
// whichever of the two it was, the leader's answer did not come.
var ErrNoLeader = errors.New("store: the stream has no leader")

// JetStream API error codes that say the group asked has no leader now
// (nats-server's errors.json; nats.go has no sentinels for them):
// jsClusterNotAvail is "JetStream system temporarily unavailable"
// (JSClusterNotAvailErr, HTTP-like code 503), which a server that knows
// its group (a stream's, or the cluster's meta group) has no leader
// answers; nats.go's 503 sentinels (JetStream not enabled) are other
// codes.
const jsClusterNotAvail = 10008

// NoLeaderError is [RideOut]'s, [AskAgain]'s and [LeaderReads]' error
// when a stream's requests went unanswered, or were answered "no
// leader", until the caller's deadline. Either is what a cluster
// electing a leader after a server's loss looks like (up to ~10 s after
// a kill -9: docs/operations.md, "Failover"); only the second says so.
// A request that is merely never answered in time is also what a single
// server too busy to answer looks like, so the message says which was
// seen (NoLeader) rather than guess. It matches [ErrNoLeader] and the
// last attempt's error.
type NoLeaderError struct {
	Stream string // the stream asked; "" when the caller does not know it
	Err    error  // the last attempt's error
	// NoLeader: an answer during the wait said there was no leader (the
	// API's 503 with error code 10008, or no stream responding to a
	// publish: jetstream.ErrNoStreamResponse). False when only timeouts
	// came.
	NoLeader bool
	// Waited is how long the asks went without the leader's answer (the
	// caller's bound); 0 when unknown.
	Waited time.Duration
}

func (e *NoLeaderError) Error() string {
	what := "the stream"
	if e.Stream != "" {
		what = "stream " + e.Stream
	}
	if e.NoLeader {
		return what + " has no leader (a cluster electing one after a server's loss?): try again in a few seconds"
	}
	within := ""
	switch {
	case e.Waited >= time.Second:
		// Whole seconds: the bound a user gave (--timeout 3s) less
		// the verb's own steps before the ask began.
		within = " within " + e.Waited.Round(time.Second).String()
	case e.Waited >= 10*time.Millisecond:
		within = " within " + e.Waited.Round(10*time.Millisecond).String()
	case e.Waited > 0:
		// Never "within 0s" (a fresh user's finding: --timeout 20ms left
		// the ask a few ms).
		within = " within " + max(e.Waited.Round(time.Millisecond), time.Millisecond).String()
	}
	return what + " did not answer" + within + " (a server too busy to answer in time, or a cluster electing a leader after a server's loss?): try again, or allow longer"
}

func (e *NoLeaderError) Unwrap() []error { return []error{ErrNoLeader, e.Err} }

// NoLeaderAnswer returns err as a [*NoLeaderError] of stream when it is an
// answer saying the group asked has no leader now (the API's 503 with
// error code 10008, no stream responding to a publish), else err as it
// is: for a read that is not asked again, so that it says what the
// verbs' ride-outs say ("stream X has no leader …: try again in a few
// seconds") instead of the server's raw 503 (a fresh user's finding m3:
// `fleet` during a quorum loss).
func NoLeaderAnswer(stream string, err error) error {
	var nl *NoLeaderError
	if err == nil || errors.As(err, &nl) || !saidNoLeader(err) {
		return err
	}
	return &NoLeaderError{Stream: stream, Err: err, NoLeader: true}
}

// leaderless reports whether err is the JetStream API's "no leader"
// answer ([saidNoLeader]), or its lack of one: a request timeout
// (nats.ErrTimeout, context.DeadlineExceeded). Not a lost connection, no
// responders to an API request or JetStream being off: those are said
// as they are.
func leaderless(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || saidNoLeader(err)
}

// saidNoLeader reports whether err is an answer saying the group asked
// has no leader now: the API's 503 with error code 10008, or no stream
// responding to a publish (jetstream.ErrNoStreamResponse: in a cluster
// only a stream's leader listens on its subjects, so a publish to an
// existing stream's subject with none has no leader to reach).
func saidNoLeader(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrNoStreamResponse) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jsClusterNotAvail)
}

// RideAttempt bounds one attempt of [RideOut]: an ask the killed leader
// took is never answered, and the leader elected after it answers only
// an ask made again. Past it the attempt is made again.
const RideAttempt = 2 * time.Second

// DefaultRideOut bounds [RideOut] when its context has no deadline and
// [WithRideOut] set no bound (the read verbs' --timeout default): an election after a kill -9 took up to
// ~10 s on a 3-server cluster, and the client's reconnect comes on top.
const DefaultRideOut = 30 * time.Second

// rideOutKey keys the bound [WithRideOut] sets.
type rideOutKey struct{}

// WithRideOut returns ctx whose [RideOut] calls, when ctx has no
// deadline, give up after d rather than [DefaultRideOut]: a read verb's
// --timeout bounds each wait for a leader, not its whole read (a long
// history read goes on past it once a leader answers).
func WithRideOut(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, rideOutKey{}, d)
}

// rideOutBound is [WithRideOut]'s bound in ctx, or def.
func rideOutBound(ctx context.Context, def time.Duration) time.Duration {
	if v, ok := ctx.Value(rideOutKey{}).(time.Duration); ok && v > 0 {
		return v
	}
	return def
}

// RideOut runs op, one JetStream request or a few, until it returns nil
// or an error that is not [Transient], or ctx ends (when ctx has no
// deadline: after [WithRideOut]'s bound, else [DefaultRideOut]): each
// attempt's context is bounded by [RideAttempt], attempts are paced
// 100 ms doubling to 1 s (±50 %). It is what every verb of the CLI asks the stream through
// before and while it publishes, so that a cluster electing a leader is
// waited out within the verb's --timeout, not failed at a fixed bound.
// stream names the stream in the error ("" when unknown).
//
// Errors: op's error that is not transient (a [DuplicateInProcess] one
// is asked again: the same message id is being stored), or that is
// [ErrStorageFull], at once; when ctx ends
// (its deadline, or the bound), a [*NoLeaderError] wrapping the
// last error when that said the stream had no leader or none came
// (leaderless: its message says which was seen), else the last error; ctx's cancellation's error as op returned it.
func RideOut[T any](ctx context.Context, stream string, op func(context.Context) (T, error)) (T, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, rideOutBound(ctx, DefaultRideOut))
		defer cancel()
	}
	b := Backoff(100*time.Millisecond, time.Second)
	start, noLeader := time.Now(), false
	for {
		actx, cancel := context.WithTimeout(ctx, RideAttempt)
		v, err := op(actx)
		cancel()
		noLeader = noLeader || saidNoLeader(err)
		// A full store is a 503 like an election's, but it lasts until an
		// operator frees space: say so now rather than after --timeout.
		// "duplicate message id is in process" (DuplicateInProcess): an
		// earlier attempt of the same message id, sent before an
		// election, is proposed and not yet stored; the next attempt is
		// answered as its duplicate or stores it.
		if err == nil || (!Transient(err) && !DuplicateInProcess(err)) || errors.Is(err, ErrStorageFull) {
			return v, err
		}
		if ctx.Err() == nil {
			t := time.NewTimer(b.NextBackOff())
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
		if ctx.Err() != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) && leaderless(err) {
				return v, &NoLeaderError{Stream: stream, Err: err, NoLeader: noLeader, Waited: time.Since(start)}
			}
			return v, err
		}
	}
}

// AskAgain's attempts: askAttemptFirst doubling to askAttemptMost (the
// client's default API timeout). An ask of the meta leader sent while
// there is none is never answered, not even once one is elected, so it is
// asked again: the caller resumes at most askAttemptMost after the group
// has a leader again, and a server merely slow to answer (a loaded
// machine) is asked at most once more than it takes, never hedged
// against with asks in parallel.
const (
	askAttemptFirst = time.Second
	askAttemptMost  = 5 * time.Second
)

// AskAgain runs op, a JetStream request the cluster's meta leader (or a
// stream's leader) answers, one attempt at a time, each bounded by 1 s
// doubling to 5 s, asking again while its error is [Unanswered] (a
// refusal that came at once, a 503, is asked again after the rest of its
// attempt's time), until op succeeds or ctx ends. A ctx without a
// deadline is bounded as [RideOut]'s: [WithRideOut]'s bound, else
// [DefaultRideOut]. It is the one way meshfold asks for what only a meta
// leader gives (a consumer's creation: [FollowRidingOut]; a bucket's
// lookup or creation: [OpenSecrets], [OpenFillStatus], [OpenNodeLeases])
// so that a meta leader's election after a kill -9 is ridden out. Unlike
// [RideOut] (attempts of 2 s, 100 ms apart), an attempt is never cut
// short of what a loaded server takes to answer a creation.
// stream names the stream in the error ("" when unknown); js, when not
// nil, is the JetStream context op asks through: a request of its
// connection naming stream that the server denies (NATS answers it with
// no reply) ends the ask at once.
//
// Errors: a [*DeniedError] (matching [ErrPermissionDenied] and
// nats.ErrPermissionViolation) as soon as a request of js naming stream
// is denied; op's error that is not [Unanswered], at once; when ctx ends,
// a [*NoLeaderError] wrapping the last error when that said there was
// no leader or none came (leaderless: its message says which was seen)
// and ctx's deadline passed, else the last error.
func AskAgain[T any](ctx context.Context, js jetstream.JetStream, stream string, op func(context.Context) (T, error)) (T, error) {
	return askAgain(ctx, js, stream, Unanswered, op)
}

// AskAgainWhile is [AskAgain] asking again while again(err) rather than
// while [Unanswered]: for an ask whose other failures pass too (a
// reconciler partition's read, whose stream may be missing for the
// moment JetStream restarts in the process). A denial of js's request
// still ends it at once; so does a ctx ended. Its attempts, bound and
// errors are AskAgain's.
func AskAgainWhile[T any](ctx context.Context, js jetstream.JetStream, stream string, again func(error) bool, op func(context.Context) (T, error)) (T, error) {
	return askAgain(ctx, js, stream, again, op)
}

// PromptAttempt is the length of [AskAgainPromptly]'s attempts for its
// first [PromptFor]: an ask sent while the cluster has no meta leader is
// never answered, so its caller sees the new leader at most this long
// after it is elected, not at the end of an attempt of up to 5 s.
const PromptAttempt = time.Second

// PromptFor is how long [AskAgainPromptly] keeps its attempts at
// [PromptAttempt]: an election after a kill -9 (4–10 s here) with room
// to spare. Past it the attempts grow as [AskAgain]'s, so that a server
// merely slower than PromptAttempt to answer (a loaded machine) is still
// answered.
const PromptFor = 15 * time.Second

// AskAgainPromptly is [AskAgain] for an ask its caller makes right after
// a leader's loss (a stream's new leader seen: the server that led it may
// have led the meta group too): its attempts are [PromptAttempt] long
// for [PromptFor], then 2 s doubling to 5 s, so that the meta leader
// elected meanwhile answers within a second of its election. Each attempt
// answered after its end may leave a consumer the server deletes after
// its inactivity threshold. Its bound, denials and errors are AskAgain's.
func AskAgainPromptly[T any](ctx context.Context, js jetstream.JetStream, stream string, op func(context.Context) (T, error)) (T, error) {
	start := time.Now()
	return askAgainPaced(ctx, js, stream, Unanswered, func(d time.Duration) time.Duration {
		if d == 0 || time.Since(start) < PromptFor {
			return PromptAttempt
		}
		return min(2*d, askAttemptMost)
	}, op)
}

// askAgain is [AskAgain] asking again while again(err).
func askAgain[T any](ctx context.Context, js jetstream.JetStream, stream string, again func(error) bool, op func(context.Context) (T, error)) (T, error) {
	return askAgainPaced(ctx, js, stream, again, func(d time.Duration) time.Duration {
		if d == 0 {
			return askAttemptFirst
		}
		return min(2*d, askAttemptMost)
	}, op)
}

// askAgainPaced is askAgain whose first attempt is next(0) long and
// each attempt after one of length d next(d) long.
func askAgainPaced[T any](ctx context.Context, js jetstream.JetStream, stream string, again func(error) bool, next func(time.Duration) time.Duration, op func(context.Context) (T, error)) (T, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, rideOutBound(ctx, DefaultRideOut))
		defer cancel()
	}
	ctx, release := guardAsk(ctx, js, stream)
	defer release()
	start, noLeader := time.Now(), false
	for d := next(0); ; d = next(d) {
		actx, cancel := context.WithTimeout(ctx, d)
		v, err := op(actx)
		noLeader = noLeader || saidNoLeader(err)
		if err != nil && again(err) && ctx.Err() == nil {
			// A refusal that came at once (a 503) is asked again
			// after the rest of the attempt's time, not at once.
			NoteWait(ctx, err)
			<-actx.Done()
		}
		cancel()
		if err != nil {
			if denied := askDenied(ctx); denied != nil {
				return v, denied
			}
		}
		if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && leaderless(err) {
			return v, &NoLeaderError{Stream: stream, Err: err, NoLeader: noLeader, Waited: time.Since(start)}
		}
		if err == nil || !again(err) || ctx.Err() != nil {
			return v, err
		}
	}
}

// waitNoteKey keys the note [WithWaitNote] sets.
type waitNoteKey struct{}

// WithWaitNote returns ctx whose asks made again while unanswered
// ([AskAgain], [EnsureStream], the bucket opens, [NoteWait]'s callers)
// call note with the unanswered ask's error before each wait: a start
// says once (note's to keep) what it waits for, instead of nothing until
// its bound ends.
func WithWaitNote(ctx context.Context, note func(err error)) context.Context {
	return context.WithValue(ctx, waitNoteKey{}, note)
}

// NoteWait calls ctx's [WithWaitNote] note, if any, with err: an ask
// unanswered, to be asked again.
func NoteWait(ctx context.Context, err error) {
	if note, ok := ctx.Value(waitNoteKey{}).(func(error)); ok {
		note(err)
	}
}

// WaitingFor says what an ask unanswered with err waits for, for a
// start's note ([WithWaitNote]).
func WaitingFor(err error) string {
	if NoPeersYet(err) {
		return "the NATS cluster's servers: a replicated stream or bucket has no room to be placed yet (a cluster just formed, or a server offline or restarting)"
	}
	return "the NATS cluster's JetStream leaders: the meta group or the stream has none yet (a cluster just started, or electing one after a server's loss)"
}
