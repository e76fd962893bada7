package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestDeposedCheckpointPutIsFenced: a session's checkpoint sequence put
// that lands after another session of the partition stored its own (a
// put sent before the session ended or lost its lease) fails its fence
// on the key's revision instead of moving the checkpoint back; the
// session, its lease lost by then, does not put it again.
func TestDeposedCheckpointPutIsFenced(t *testing.T) {
	t.Parallel()
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{Partitions: 1})
	ctx := t.Context()
	r, err := NewReconciler(ctx, js, ReconcilerConfig{Stream: cfg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	// The deposed session read the key before its successor started: at
	// revision 0 (never written). Its lease holds for the check before
	// its put, and is gone after.
	var checks atomic.Int32
	p := &partition{r: r, revoked: context.Background(), valid: func() bool { return checks.Add(1) == 1 }}
	deposed := &session{p: p}
	// The successor's checkpoint.
	if _, err := r.snaps.PutCheckpointAt(ctx, 0, 10, 0); err != nil {
		t.Fatal(err)
	}
	err = deposed.writeCheckpoint(ctx, &checkpointWrite{ck: 5, base: 0, ckRev: 0})
	if !errors.Is(err, ErrLeaseLost) {
		t.Errorf("the deposed session's checkpoint write ended with %v, want its lease lost after the fence failed", err)
	}
	if checks.Load() < 2 {
		t.Errorf("the lease was checked %d times: the put was not made", checks.Load())
	}
	if ck, err := r.snaps.Checkpoint(ctx, 0); err != nil || ck != 10 {
		t.Fatalf("stored checkpoint %d (%v), want the successor's 10", ck, err)
	}
}
