package query_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestTailNodesReadsToTheLeadersEnd: the events past each partition's
// checkpoint are read up to the newest one as the stream's leader has it
// (PartitionLag.Last), even when the server places the read's consumer on
// a replica held behind the leader (storetest.Lag), which reports nothing
// pending at its own end: every node with such an event is named, at its
// newest. Sixteen partitions, so that some consumers land on the held
// replica.
func TestTailNodesReadsToTheLeadersEnd(t *testing.T) {
	t.Parallel()
	c, lag := storetest.StartLaggingCluster(t, 3)
	nc, js := c.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3, Partitions: 16})
	if err != nil {
		t.Fatal(err)
	}
	pub := store.NewPublisher(js, cfg.Subjects())
	subj := cfg.Subjects()
	const nodes = 48
	appendAll := func() (last map[int]uint64, newest map[string]uint64) {
		last, newest = map[int]uint64{}, map[string]uint64{}
		for i := range nodes {
			node := fmt.Sprintf("n%02d", i)
			ack, err := pub.Append(ctx, node, events.Stamp(&events.Want{Modules: []events.WantModule{}}, time.Now()))
			if err != nil {
				t.Fatal(err)
			}
			last[subj.Partition(node)], newest[node] = ack.Seq, ack.Seq
		}
		return last, newest
	}
	checkpoints, _ := appendAll()
	c.WaitDirectGets(cfg.Name)
	held := c.Follower(cfg.Name)
	lag.Hold(held.Name())
	defer lag.Release()
	ends, want := appendAll() // the held replica has not these
	var sl query.SnapshotLag
	for p := range subj.N() {
		sl.Partitions = append(sl.Partitions, query.PartitionLag{Partition: p, Checkpoint: checkpoints[p], Last: ends[p]})
	}
	r, err := query.New(nc, query.Config{Stream: cfg})
	if err != nil {
		t.Fatal(err)
	}
	// The release comes after a while: a read that waits for the held
	// replica then ends; one that ended at the replica's end has.
	release := time.AfterFunc(3*time.Second, lag.Release)
	defer release.Stop()
	got, complete, err := r.TailNodes(ctx, sl, 10000)
	if err != nil {
		t.Fatal(err)
	}
	if !complete {
		t.Errorf("TailNodes says it did not read every event")
	}
	for node, seq := range want {
		if got[node] != seq {
			t.Errorf("node %s named at #%d, want its newest event #%d: the read of partition %d ended at a replica's end", node, got[node], seq, subj.Partition(node))
		}
	}
}
