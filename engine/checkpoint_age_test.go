package engine_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
)

// A checkpoint leaves a changed state unwritten for a few checkpoints
// (docs/architecture.md, "Live: states put by age"), and then claims no
// more than the stored states cover: at every checkpoint, each node's
// stored state covers every event of it up to the stored checkpoint. A
// node whose state waits holds the checkpoint back only until its age is
// reached, while other nodes keep the partition busy; a restart from there
// folds to the states of the pure fold.
func TestCheckpointPutsStatesByAge(t *testing.T) {
	t.Parallel()
	g := newRig(t, store.StreamConfig{})
	// Two nodes of one partition.
	hot, cold := "", ""
	for i := 0; cold == ""; i++ {
		n := fmt.Sprintf("n%d", i)
		switch {
		case hot == "":
			hot = n
		case events.Partition(n, g.cfg.Partitions) == events.Partition(hot, g.cfg.Partitions):
			cold = n
		}
	}
	p := events.Partition(hot, g.cfg.Partitions)
	snaps, err := store.OpenSnapshots(context.Background(), g.js, g.cfg)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu        sync.Mutex
		appended  = map[string][]uint64{} // each node's events, by sequence
		bad       []string
		coldAt    uint64 // the stored checkpoint when cold's state was first put
		heldBelow bool   // a checkpoint was stored below cold's event while cold's state waited
	)
	stored := func(node string) uint64 {
		b, _, err := snaps.GetNode(context.Background(), node)
		if err != nil {
			return 0
		}
		st, err := reconcile.UnmarshalState(b)
		if err != nil {
			t.Error(err)
			return 0
		}
		return st.Seq
	}
	check := func(part int, _ uint64) error {
		if part != p {
			return nil
		}
		ck, err := snaps.Checkpoint(context.Background(), p)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for node, seqs := range appended {
			var last uint64
			for _, s := range seqs {
				if s <= ck {
					last = max(last, s)
				}
			}
			if got := stored(node); got < last {
				bad = append(bad, fmt.Sprintf("checkpoint #%d, but %s's stored state covers #%d of its event #%d", ck, node, got, last))
			}
		}
		if c := appended[cold]; len(c) > 0 {
			if stored(cold) >= c[0] {
				if coldAt == 0 {
					coldAt = ck
				}
			} else if ck < c[0] && ck > 0 {
				heldBelow = true
			}
		}
		return nil
	}
	add := func(node string) uint64 {
		s := g.append(node, provOnly())
		mu.Lock()
		appended[node] = append(appended[node], s)
		mu.Unlock()
		return s
	}
	rn := g.startCfg(engine.ReconcilerConfig{SnapshotEvery: 2, SnapshotInterval: time.Hour,
		Faults: engine.Faults{AfterCheckpoint: check}, Logger: testLogger(t)})
	// The session live (past any recovery of what it found at its
	// start) before the events that count.
	first := add(hot)
	eventually(t, "the first event folded", func() bool {
		st, ok := rn.r.Node(hot)
		return ok && st.Seq >= first
	})
	for range 3 {
		add(hot)
	}
	add(cold)
	// hot alone keeps the partition folding: checkpoints every two events,
	// by count, none of them full (the interval is an hour).
	for range 30 {
		add(hot)
	}
	eventually(t, "cold's state put by age", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return coldAt != 0
	})
	rn.stop(t)
	mu.Lock()
	for _, b := range bad {
		t.Error(b)
	}
	if !heldBelow {
		t.Error("no checkpoint was held below cold's event while its state waited")
	}
	mu.Unlock()
	// The graceful stop puts every state: the checkpoint covers every
	// event, and a restart folds to the pure fold's states.
	last := add(hot)
	rn2 := g.start(engine.Faults{})
	eventually(t, "the last event folded", func() bool {
		st, ok := rn2.r.Node(hot)
		return ok && st.Seq >= last
	})
	g.verify(rn2.r)
}
