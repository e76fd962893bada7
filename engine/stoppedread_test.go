package engine

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestLeaderReadStoppedIsTheStop: a leader read whose attempt goes
// unanswered (timed out behind a loaded server's JetStream API queue,
// or refused for want of a leader) when the session's ctx ends, or whose
// ctx ends between two attempts, ends with ctx's cause, not the
// attempt's timeout: run takes a session ended with the stop's
// context.Canceled for one stopped while it started, with nothing to
// write, and any other error for a failure left Unsaved. Under load a
// cold session's holdsEffects ask timed out its first attempt, the stop
// came before the second's answer, and a clean stop left the partition
// Unsaved ("effects of partition 4: message get from the leader of
// MESH: context deadline exceeded"; TestUnsavedSnapshots, 6 of 40 runs
// at load 12-24, on main as with issue 27's cold-start change). A
// refusal that is not "unanswered", and a lost lease's cause, stay
// theirs.
func TestLeaderReadStoppedIsTheStop(t *testing.T) {
	t.Parallel()
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{Partitions: 1})
	r, err := NewReconciler(t.Context(), js, ReconcilerConfig{Stream: cfg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	p := &partition{r: r, revoked: context.Background()}
	for _, c := range []struct {
		name    string
		attempt error // the first attempt's answer, ctx ending during it
	}{
		{"timed out", context.DeadlineExceeded},
		{"no responders", nats.ErrNoResponders},
		{"no answer, wrapped", errors.Join(errors.New("effects of partition 4: message get from the leader of MESH"), context.DeadlineExceeded)},
	} {
		t.Run(c.name+", stopped during the attempt", func(t *testing.T) {
			ctx, stop := context.WithCancel(t.Context())
			calls := 0
			err := p.leaderRead(ctx, func(context.Context) error {
				calls++
				stop()
				return c.attempt
			})
			if !errors.Is(err, context.Canceled) || store.Unanswered(err) || calls != 1 {
				t.Errorf("ended with %v after %d attempts, want the stop's context.Canceled, not unanswered, after 1", err, calls)
			}
		})
		t.Run(c.name+", stopped between attempts", func(t *testing.T) {
			// The stop lands while retry pauses before its next attempt,
			// or, if the pause is over first, during that attempt: the
			// read ends with the stop either way.
			ctx, stop := context.WithCancel(t.Context())
			calls := 0
			err := p.leaderRead(ctx, func(actx context.Context) error {
				calls++
				if calls == 1 {
					go stop()
				}
				return c.attempt
			})
			if !errors.Is(err, context.Canceled) || store.Unanswered(err) {
				t.Errorf("ended with %v after %d attempts, want the stop's context.Canceled, not unanswered", err, calls)
			}
		})
	}

	// A refusal (not "unanswered") is the read's error, stop or no stop.
	refused := errors.New("permissions violation")
	ctx, stop := context.WithCancel(t.Context())
	err = p.leaderRead(ctx, func(context.Context) error {
		stop()
		return refused
	})
	if !errors.Is(err, refused) {
		t.Errorf("a refusal as the read stopped ended with %v, want the refusal", err)
	}

	// A write cut off by its lease's loss (the session's work context,
	// cancelled with the loss as its cause) ends with the loss.
	lost := &partition{r: r, revoked: context.Background()}
	work, cancelWork := context.WithCancelCause(t.Context())
	err = lost.retry(work, func(context.Context) (bool, error) {
		cancelWork(ErrLeaseLost)
		return true, context.DeadlineExceeded
	})
	if !errors.Is(err, ErrLeaseLost) || errors.Is(err, context.Canceled) {
		t.Errorf("a write whose work context was cancelled by the lease's loss ended with %v, want ErrLeaseLost", err)
	}
}
