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
