package engine

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestCheckpointWriteSlowIsNotGone: a checkpoint write whose attempts
// time out while storing part of their puts each time (a starved server
// acknowledging a cold refold's thousands of states slowly) is tried
// until it is stored, not ended as a lost leader after electionRideOut
// or an attempt of ackTimeout: at 100,000 nodes on a loaded machine such
// writes ended sessions mid-refold, "put snapshots: context deadline
// exceeded", and each refolded from its snapshot (issue 27). An attempt
// that stores nothing still ends the write, and a lost lease ends it at
// once.
func TestCheckpointWriteSlowIsNotGone(t *testing.T) {
	t.Parallel()
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{Partitions: 1})
	ctx := t.Context()
	r, err := NewReconciler(ctx, js, ReconcilerConfig{Stream: cfg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	held := true
	s := &session{p: &partition{r: r, revoked: context.Background(), valid: func() bool { return held }}}
	// More slow attempts than the ride-out's doubling allows (1, 2, 4,
	// then 5 s: four attempts end a write that stores nothing).
	const slow = 8
	calls := 0
	err = s.retryWrite(ctx, func(context.Context) (bool, error) {
		calls++
		if calls <= slow {
			return true, context.DeadlineExceeded // part of it stored
		}
		return false, nil
	})
	if err != nil || calls != slow+1 {
		t.Errorf("a write storing part of itself at each attempt ended with %v after %d attempts, want stored after %d", err, calls, slow+1)
	}

	calls = 0
	err = s.retryWrite(ctx, func(context.Context) (bool, error) {
		calls++
		if calls > 2*slow {
			return false, nil
		}
		return false, context.DeadlineExceeded // nothing stored
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a write storing nothing at %d attempts ended with %v, want its deadline exceeded", calls, err)
	}

	calls = 0
	err = s.retryWrite(ctx, func(context.Context) (bool, error) {
		calls++
		held = calls < 3
		if calls > slow {
			return false, nil
		}
		return true, context.DeadlineExceeded
	})
	if !errors.Is(err, ErrLeaseLost) || calls != 3 {
		t.Errorf("a slow write whose lease was lost at its 3rd attempt ended with %v after %d attempts, want ErrLeaseLost after 3", err, calls)
	}
}
