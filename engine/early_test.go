package engine_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/engine/enginetest"
	"github.com/meshfold/meshfold/store"
)

// TestFirstRefoldPublishesAsItReads: a first refold (a stream of inputs
// alone, no effect of the partition stored, no snapshot) publishes its
// effects while it reads, each subject's fenced behind the one before,
// and so may checkpoint during its recovery; a recovery that defers them
// to its read's end publishes nothing and checkpoints nothing before then
// (issue 27). Killed mid-read, it has stored effects and a checkpoint
// that covers them; its successor refolds from that checkpoint under the
// recovery rule (the partition now holds effects, so it defers and finds
// them stored), and every effect the pure fold of the stream makes is
// stored exactly once, every state equal to that fold.
func TestFirstRefoldPublishesAsItReads(t *testing.T) {
	t.Parallel()
	g := newRig(t, store.StreamConfig{Partitions: 1})
	last := enginetest.SimulateDenseInputs(3_000, 30).Load(t, g.js)
	crashAt := last * 2 / 3
	var (
		mu  sync.Mutex
		mid []uint64 // checkpoints written before the range's end
	)
	f := engine.Faults{
		AfterCheckpoint: func(_ int, seq uint64) error {
			mu.Lock()
			defer mu.Unlock()
			if seq < last {
				mid = append(mid, seq)
			}
			return nil
		},
		AfterFold: func(_ int, seq uint64) error {
			if seq == crashAt {
				return errCrash
			}
			return nil
		},
	}
	rn := g.startCfg(engine.ReconcilerConfig{Faults: f, RecoveryCheckpointInterval: time.Nanosecond,
		SnapshotEvery: 3, SnapshotInterval: 20 * time.Millisecond, Logger: testLogger(t)})
	if err := rn.wait(t); !errors.Is(err, errCrash) {
		t.Fatalf("the first refold ended with %v, want the crash at #%d", err, crashAt)
	}
	_, end, err := store.StreamBounds(t.Context(), g.stream)
	if err != nil {
		t.Fatal(err)
	}
	if end == last {
		t.Fatalf("the first refold, killed at #%d of #%d, had stored no effect", crashAt, last)
	}
	mu.Lock()
	ck := uint64(0)
	if len(mid) > 0 {
		ck = mid[len(mid)-1]
	}
	mu.Unlock()
	if ck == 0 || ck >= crashAt {
		t.Fatalf("last checkpoint during the first refold at #%d (of %d written), want one before the crash at #%d", ck, len(mid), crashAt)
	}
	snaps, err := store.OpenSnapshots(t.Context(), g.js, g.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := snaps.Checkpoint(t.Context(), 0); err != nil || got != ck {
		t.Fatalf("stored checkpoint %d (%v), want %d", got, err, ck)
	}

	// The successor resumes from that checkpoint.
	var (
		firstMu sync.Mutex
		first   uint64
	)
	rn2 := g.startCfg(engine.ReconcilerConfig{SnapshotEvery: 3, SnapshotInterval: 20 * time.Millisecond, Logger: testLogger(t),
		Faults: engine.Faults{AfterFold: func(_ int, seq uint64) error {
			firstMu.Lock()
			defer firstMu.Unlock()
			if first == 0 {
				first = seq
			}
			return nil
		}}})
	g.verify(rn2.r)
	firstMu.Lock()
	defer firstMu.Unlock()
	if first != ck+1 {
		t.Errorf("the successor's first fold at #%d, want #%d, after the checkpoint", first, ck+1)
	}
}
