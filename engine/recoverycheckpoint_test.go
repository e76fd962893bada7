package engine_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/store"
)

// TestRecoveryCheckpointResume: a session refolding a range whose effects
// an earlier run stored checkpoints before it has caught up, then dies
// (as when its lease is lost: nothing more is written) with events folded
// past that checkpoint and effects still to publish. Its successor refolds
// only from that checkpoint, and every effect is stored exactly once: the
// stored ones are not published again, the ones no run published are not
// lost, and every state is the pure fold of the stream (issue 27).
func TestRecoveryCheckpointResume(t *testing.T) {
	t.Parallel()
	g := newRig(t, store.StreamConfig{Partitions: 1})
	ctx := context.Background()
	// A first run folds incident 1 on a few nodes and stores every
	// effect; its snapshots are then removed, so that the next run
	// recovers the whole stream with every effect of it stored.
	rn := g.start(engine.Faults{})
	nodes := []string{"ace", "bay", "cod", "dun", "elm", "fir"}
	for _, node := range nodes {
		g.incident1(node)
	}
	eventually(t, "the knocks", func() bool {
		for _, node := range nodes {
			if g.knocksOf(node) != 1 {
				return false
			}
		}
		return true
	})
	rn.stop(t)
	kv, err := g.js.KeyValue(ctx, g.cfg.Name+store.SnapshotBucketSuffix)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, "checkpoint.0"); err != nil {
		t.Fatal(err)
	}
	for _, node := range nodes {
		if err := kv.Purge(ctx, "node.0."+node); err != nil {
			t.Fatal(err)
		}
	}
	stored := len(g.all())
	// Inputs no run has folded, at the range's end: their plans are
	// stored nowhere, so from the first of them on nothing may be
	// checkpointed before the recovery's end publishes them.
	late := []string{"gum", "hob", "ivy", "jay", "kit", "lox"}
	var unstored uint64 // the first late input
	for i, node := range late {
		if seq := g.append(node, provOnly()); i == 0 {
			unstored = seq
		}
	}
	_, last, err := store.StreamBounds(ctx, g.stream)
	if err != nil {
		t.Fatal(err)
	}

	// The second run checkpoints wherever it may (every effect deferred so
	// far seen stored) and dies at the third late input, its plans and the
	// two before it deferred and unpublished.
	var (
		mu       sync.Mutex
		mid      []uint64 // checkpoints written before the end of the range
		crashSeq uint64
		armed    int // late inputs folded
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
			mu.Lock()
			defer mu.Unlock()
			if seq < unstored {
				return nil
			}
			if armed++; armed == 3 {
				crashSeq = seq
				return errCrash
			}
			return nil
		},
	}
	rn2 := g.startCfg(engine.ReconcilerConfig{Faults: f, RecoveryCheckpointInterval: time.Nanosecond,
		SnapshotEvery: 3, SnapshotInterval: 20 * time.Millisecond, Logger: testLogger(t)})
	if err := rn2.wait(t); !errors.Is(err, errCrash) {
		t.Fatalf("second run ended with %v, want the crash", err)
	}
	mu.Lock()
	if len(mid) == 0 {
		mu.Unlock()
		t.Fatal("no checkpoint was written during the recovery")
	}
	ck := mid[len(mid)-1]
	crashedAt := crashSeq
	mu.Unlock()
	if ck >= unstored {
		t.Fatalf("checkpoint %d written past #%d, whose plan was deferred and not yet published", ck, unstored)
	}
	snaps, err := store.OpenSnapshots(ctx, g.js, g.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := snaps.Checkpoint(ctx, 0); err != nil || got != ck {
		t.Fatalf("stored checkpoint %d (%v), want the last written mid-recovery, %d", got, err, ck)
	}
	if ck >= crashedAt || crashedAt > last {
		t.Fatalf("checkpoint %d, crash at %d, range's end %d: not a crash mid-recovery after a checkpoint", ck, crashedAt, last)
	}
	if n := len(g.all()); n != stored+len(late) {
		t.Fatalf("the stream holds %d messages, want %d: the crashed recovery published", n, stored+len(late))
	}

	// The successor refolds from that checkpoint, not from the start.
	var (
		firstMu sync.Mutex
		first   uint64
	)
	rn3 := g.startCfg(engine.ReconcilerConfig{SnapshotEvery: 3, SnapshotInterval: 20 * time.Millisecond, Logger: testLogger(t),
		Faults: engine.Faults{AfterFold: func(_ int, seq uint64) error {
			firstMu.Lock()
			defer firstMu.Unlock()
			if first == 0 {
				first = seq
			}
			return nil
		}}})
	if k := g.verify(rn3.r); k != len(nodes) {
		t.Fatalf("%d knocks, want %d", k, len(nodes))
	}
	for _, node := range late {
		g.planFor(node, 1)
	}
	firstMu.Lock()
	defer firstMu.Unlock()
	if first <= ck {
		t.Fatalf("the successor folded %d first, at or before the checkpoint %d", first, ck)
	}
	t.Logf("recovering 1..%d: checkpoints %v before its end, crash at %d; the successor folded from %d", last, mid, crashedAt, first)
}
