package waitfor

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// The backoff between polls: from First, doubling, to at most Most.
const (
	First = time.Millisecond
	Most  = 50 * time.Millisecond
)

// Until polls cond, backing off from [First] to [Most] between polls,
// until it holds. After limit (or just before the test binary's own
// deadline, if that comes first) it fails t with "timed out after
// <limit> waiting for <what>". Call it from the test's goroutine.
func Until(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	until(t, limit, what, nil, func() (struct{}, bool) { return struct{}{}, cond() }, false)
}

// UntilOn is [Until] that also tries cond each time wake delivers (a
// change notification), so it sees an event without waiting for the next
// poll. The polls remain: a notification may be coalesced or missed.
func UntilOn(t testing.TB, limit time.Duration, what string, wake <-chan struct{}, cond func() bool) {
	t.Helper()
	until(t, limit, what, wake, func() (struct{}, bool) { return struct{}{}, cond() }, false)
}

// Value polls get, as [Until] polls its condition, until get reports ok,
// and returns the value it gave then. On a timeout the failure quotes the
// last value get gave (%+v), so the message says what it saw instead.
func Value[T any](t testing.TB, limit time.Duration, what string, get func() (T, bool)) T {
	t.Helper()
	return until(t, limit, what, nil, get, true)
}

// Poll polls get, with the same backoff, until it reports ok or ctx ends,
// and returns the value it gave last. When ctx ends first the error wraps
// ctx's error and quotes what: it is for goroutines a test starts (which
// must not call t.Fatalf) and for code that reports errors itself.
func Poll[T any](ctx context.Context, what string, get func() (T, bool)) (T, error) {
	wait := First
	for {
		v, ok := get()
		if ok {
			return v, nil
		}
		select {
		case <-ctx.Done():
			return v, fmt.Errorf("waiting for %s (last saw %+v): %w", what, v, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, Most)
	}
}

func until[T any](t testing.TB, limit time.Duration, what string, wake <-chan struct{}, get func() (T, bool), show bool) T {
	t.Helper()
	start := time.Now()
	end := start.Add(limit)
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		// Fail with the message before the binary's timeout kills it
		// with a stack dump that does not say what was awaited.
		if dl, ok := d.Deadline(); ok && dl.Add(-time.Second).Before(end) {
			end = dl.Add(-time.Second)
		}
	}
	wait := First
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		v, ok := get()
		if ok {
			return v
		}
		if !time.Now().Before(end) {
			if show {
				t.Fatalf("timed out after %v waiting for %s; last saw %+v", time.Since(start).Round(time.Millisecond), what, v)
			} else {
				t.Fatalf("timed out after %v waiting for %s", time.Since(start).Round(time.Millisecond), what)
			}
			return v
		}
		timer.Reset(min(wait, time.Until(end)))
		select {
		case <-wake:
		case <-timer.C:
		}
		wait = min(2*wait, Most)
	}
}
