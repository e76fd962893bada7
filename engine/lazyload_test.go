package engine_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/store"
)

// TestRestartFoldsTailFirst: a restart whose tail is short beside the
// states stored reads only the states its tail names before folding it
// (issue 27: a restart is O(tail), not O(nodes)), then every other one;
// the states and effects are those of the pure fold of the stream, and
// the next checkpoint writes the tail's node at the revision its
// snapshot had.
func TestRestartFoldsTailFirst(t *testing.T) {
	t.Parallel()
	g := newRig(t, store.StreamConfig{Partitions: 1})
	const nodes = 40
	names := make([]string, nodes)
	rn := g.start(engine.Faults{})
	for i := range names {
		names[i] = fmt.Sprintf("n%02d", i)
		g.planFor(names[i], g.append(names[i], want("b1")))
	}
	// Checkpointed through the last plan: the restart's tail is then the
	// one event below (a plan not yet read back would be in it too).
	snaps, err := store.OpenSnapshots(context.Background(), g.js, g.cfg)
	if err != nil {
		t.Fatal(err)
	}
	info, err := g.stream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the checkpoint through the last plan", func() bool {
		ck, err := snaps.Checkpoint(context.Background(), 0)
		return err == nil && ck >= info.State.LastSeq
	})
	rn.stop(t)

	tail := g.append("n07", want("b2"))
	var r atomic.Pointer[engine.Reconciler]
	held := make(chan int, 1)
	ctx, cancel := context.WithCancel(context.Background())
	rec, err := engine.NewReconciler(ctx, g.js, engine.ReconcilerConfig{Stream: g.cfg,
		SnapshotEvery: 3, SnapshotInterval: 20 * time.Millisecond, Logger: testLogger(t),
		Faults: engine.Faults{AfterFold: func(_ int, seq uint64) error {
			if seq == tail {
				select {
				case held <- len(r.Load().Nodes()):
				default:
				}
			}
			return nil
		}}})
	if err != nil {
		t.Fatal(err)
	}
	r.Store(rec)
	done := make(chan error, 1)
	go func() { done <- rec.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case n := <-held:
		if n != 1 {
			t.Errorf("the restart held %d states when it folded its tail's one event, want 1 (the tail's node)", n)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the tail's event was not folded")
	}
	g.planFor("n07", tail)
	eventually(t, "every state read after the tail", func() bool { return len(rec.Nodes()) == nodes })
	// A later event of the tail's node and of another: their snapshots
	// are put at the revisions read (a wrong one ends the session in a
	// conflict, and the plans would not come).
	g.planFor("n07", g.append("n07", want("b3")))
	g.planFor("n31", g.append("n31", want("b3")))
	g.verify(rec)
}

// TestRestartTailOfSeveralNodes: a restart whose tail names several
// nodes, one of them twice, reads each node's snapshot at its first event
// of the tail and folds the tail to the states and effects of the pure
// fold of the stream; each node's next snapshot put expects the revision
// read (a wrong one would end the session in a conflict, and the later
// plans would not come).
func TestRestartTailOfSeveralNodes(t *testing.T) {
	t.Parallel()
	const nodes = 40
	g := restRig(t, nodes)

	tail := map[string]uint64{}
	for i, name := range []string{"n03", "n17", "n29", "n03", "n35"} {
		tail[name] = g.append(name, want(fmt.Sprintf("b2-%d", i)))
	}
	ctx, cancel := context.WithCancel(context.Background())
	rec, err := engine.NewReconciler(ctx, g.js, engine.ReconcilerConfig{Stream: g.cfg,
		SnapshotEvery: 3, SnapshotInterval: 20 * time.Millisecond, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- rec.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	for name, seq := range tail {
		g.planFor(name, seq)
	}
	eventually(t, "every state read after the tail", func() bool { return len(rec.Nodes()) == nodes })
	for _, name := range []string{"n03", "n17", "n35"} {
		g.planFor(name, g.append(name, want("b3")))
	}
	g.verify(rec)
}
