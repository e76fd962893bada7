package query_test

import (
	"context"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestTailNodesNamesOnlyFoldedEvents: a node's stored state is folded
// from its input events only (the reconciler's knocks and journal
// entries are not folded: its Seq never reaches theirs), so an entry of
// its journal, or a knock, past a lagging checkpoint says nothing of
// whether its state is behind. TailNodes named such a node at the entry's
// sequence, and fleet -o json marked a node whose snapshot was current
// "behind":true (a reviewer's finding).
func TestTailNodesNamesOnlyFoldedEvents(t *testing.T) {
	t.Parallel()
	_, nc, js, _, cfg := storetest.StartStream(t, store.StreamConfig{Partitions: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub := store.NewPublisher(js, cfg.Subjects())
	at := time.Now()
	ck, err := pub.Append(ctx, "ace", events.Stamp(&events.Want{Modules: []events.WantModule{}}, at))
	if err != nil {
		t.Fatal(err)
	}
	// Past the checkpoint: bob's want, then the reconciler's notes on
	// both nodes.
	bob, err := pub.Append(ctx, "bob", events.Stamp(&events.Want{Modules: []events.WantModule{}}, at))
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	for _, node := range []string{"ace", "bob"} {
		if _, err := pub.Append(ctx, node, events.Stamp(&events.Journal{Level: events.LevelWarn, Msg: "note", Cause: ck.Seq}, at)); err != nil {
			t.Fatal(err)
		}
		a, err := pub.Append(ctx, node, events.Stamp(&events.Knock{Cause: ck.Seq, Reasons: []events.KnockReason{events.KnockOperator}, Owed: []events.Owed{}}, at))
		if err != nil {
			t.Fatal(err)
		}
		last = a.Seq
	}
	r, err := query.New(nc, query.Config{Stream: cfg})
	if err != nil {
		t.Fatal(err)
	}
	sl := query.SnapshotLag{Partitions: []query.PartitionLag{{Partition: 0, Checkpoint: ck.Seq, Last: last}}}
	got, complete, err := r.TailNodes(ctx, sl, 100)
	if err != nil || !complete {
		t.Fatalf("TailNodes: complete %v, %v", complete, err)
	}
	if seq, ok := got["ace"]; ok {
		t.Errorf("ace named at #%d: only its journal entry and knock are past the checkpoint, which its state never folds", seq)
	}
	if got["bob"] != bob.Seq {
		t.Errorf("bob named at #%d, want #%d (its want, the newest event its state folds)", got["bob"], bob.Seq)
	}
}
