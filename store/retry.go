package store

import (
	"context"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
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
