package store_test

import (
	"context"
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
)

// RideOut asks again while the answer says the stream has no leader (or
// none comes), each attempt bounded by RideAttempt, and returns the
// first answer that is not transient (a fresh user's finding V2: a
// verb's stream lookup gave up at a fixed 10 s in an election).
func TestRideOutAsksAgainUntilALeaderAnswers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	asks := 0
	v, err := store.RideOut(ctx, "MESH", func(actx context.Context) (int, error) {
		asks++
		if dl, ok := actx.Deadline(); !ok || time.Until(dl) > store.RideAttempt {
			t.Errorf("ask %d: its context is not bounded by RideAttempt", asks)
		}
		switch asks {
		case 1:
			return 0, jetstream.ErrNoStreamResponse
		case 2:
			return 0, &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}
		case 3:
			<-actx.Done() // the killed leader never answers
			return 0, actx.Err()
		}
		return 42, nil
	})
	if err != nil || v != 42 || asks != 4 {
		t.Fatalf("RideOut = %d, %v after %d asks; want 42, nil after 4", v, err, asks)
	}
}

// What NoLeaderError says, as patterns: the wait said is the deadline's
// 300 ms, or more on a loaded machine (the test bounds it by 2 s; the
// pattern allowed 390 ms, and a run at machine load ~35 said 400ms).
const (
	sayNoLeader = `^stream MESH has no leader \(a cluster electing one after a server's loss\?\): try again in a few seconds$`
	sayNoAnswer = `^stream MESH did not answer within ([3-9][0-9]0ms|[12](\.[0-9]+)?s) \(a server too busy to answer in time, or a cluster electing a leader after a server's loss\?\): try again, or allow longer$`
)

// A refusal is returned at once; no leader until the deadline is said
// plainly, naming the stream (finding V3), and still matches the last
// answer's error. "No leader" is said only when an answer said so (no
// stream responding to a publish, the API's 503 with code 10008); asks
// that merely went unanswered (a single server too busy to answer in
// time looks the same) say that instead, with the wait, and match
// ErrNoLeader all the same.
func TestRideOutSaysNoLeader(t *testing.T) {
	// Not parallel: it times the ride-out against 2 s.
	ctx := context.Background()
	asks := 0
	_, err := store.RideOut(ctx, "MESH", func(context.Context) (int, error) { asks++; return 0, jetstream.ErrStreamNotFound })
	if !errors.Is(err, jetstream.ErrStreamNotFound) || asks != 1 {
		t.Errorf("a refusal: %v after %d asks, want it at once", err, asks)
	}

	for _, c := range []struct {
		name string
		last error // what every ask gets
		want string
	}{
		{"no stream responds", jetstream.ErrNoStreamResponse, sayNoLeader},
		{"the API's no leader (10008)", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, sayNoLeader},
		{"no answer", context.DeadlineExceeded,
			sayNoAnswer},
	} {
		ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		t0 := time.Now()
		_, err = store.RideOut(ctx, "MESH", func(context.Context) (int, error) { return 0, c.last })
		cancel()
		if d := time.Since(t0); d > 2*time.Second {
			t.Errorf("%s: RideOut gave up %s after a 300 ms deadline", c.name, d)
		}
		if !errors.Is(err, store.ErrNoLeader) || !errors.Is(err, c.last) {
			t.Fatalf("%s until the deadline: %v, want it to match ErrNoLeader and the last answer", c.name, err)
		}
		if !regexp.MustCompile(c.want).MatchString(err.Error()) {
			t.Errorf("%s until the deadline says %q, want %q", c.name, err, c.want)
		}
	}

	// An answer that said no leader, then asks cut short by the
	// deadline: the wait saw no leader, and says so.
	ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	asks = 0
	_, err = store.RideOut(ctx, "MESH", func(actx context.Context) (int, error) {
		if asks++; asks == 1 {
			return 0, jetstream.ErrNoStreamResponse
		}
		<-actx.Done()
		return 0, actx.Err()
	})
	if !errors.Is(err, store.ErrNoLeader) || !regexp.MustCompile(sayNoLeader).MatchString(err.Error()) {
		t.Errorf("no leader, then no answer until the deadline: %v, want %q", err, sayNoLeader)
	}
}

// AskAgain says it the same way: "no leader" when an answer said so,
// else that nothing answered within its wait.
func TestAskAgainSaysWhatItSaw(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		last error
		want string
	}{
		{"the API's no leader (10008)", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, sayNoLeader},
		{"no answer", context.DeadlineExceeded,
			sayNoAnswer},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_, err := store.AskAgain(ctx, nil, "MESH", func(context.Context) (int, error) { return 0, c.last })
		cancel()
		if !errors.Is(err, store.ErrNoLeader) || !errors.Is(err, c.last) || !regexp.MustCompile(c.want).MatchString(err.Error()) {
			t.Errorf("%s until the deadline: %q, want %q matching ErrNoLeader and the last answer", c.name, err, c.want)
		}
	}
}

// An attempt answered "duplicate message id is in process" (10158: the
// same message id, sent before an election, is proposed and not yet
// stored) is asked again, not returned: TestAppendRetryingThroughALeaderElection
// failed on it under load (fastsign's race run, 4 December).
func TestRideOutAsksAgainWhileTheSameIDIsInProcess(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	asks := 0
	v, err := store.RideOut(ctx, "MESH", func(context.Context) (int, error) {
		asks++
		if asks == 1 {
			return 0, &jetstream.APIError{Code: 409, ErrorCode: 10158, Description: "duplicate message id is in process"}
		}
		return 7, nil
	})
	if err != nil || v != 7 || asks != 2 {
		t.Fatalf("RideOut = %d, %v after %d asks; want 7, nil after 2", v, err, asks)
	}
}
