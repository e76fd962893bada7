package engine_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestRecoveryEndsAtTheLeadersEnd: a session's recovery ends once its
// read has passed the partition's messages up to the stream's last
// sequence at its start, as the stream's leader has them, even when the
// server places its consumer on a replica held behind the leader
// (storetest.Lag), which reports nothing pending at its own end: every
// partition's first checkpoint covers its last input. Sixteen
// partitions, so that some consumers land on the held replica (all miss
// it in 0.15 % of runs).
func TestRecoveryEndsAtTheLeadersEnd(t *testing.T) {
	t.Parallel()
	c, lag := storetest.StartLaggingCluster(t, 3)
	_, js := c.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3, Partitions: 16})
	if err != nil {
		t.Fatal(err)
	}
	pub := store.NewPublisher(js, cfg.Subjects())
	subj := cfg.Subjects()
	end := map[int]uint64{} // each partition's last input
	appendAll := func(build string) {
		for i := range 48 {
			node := fmt.Sprintf("n%02d", i)
			ack, err := pub.Append(ctx, node, events.Stamp(want(build), time.Now()))
			if err != nil {
				t.Fatal(err)
			}
			end[subj.Partition(node)] = ack.Seq
		}
	}
	appendAll("b1")
	var (
		mu    sync.Mutex
		first = map[int]uint64{} // each partition's first checkpoint
		took  = make(chan struct{}, 64)
	)
	r, err := engine.NewReconciler(ctx, js, engine.ReconcilerConfig{Stream: cfg, Logger: testLogger(t),
		Faults: engine.Faults{AfterCheckpoint: func(p int, seq uint64) error {
			mu.Lock()
			defer mu.Unlock()
			if _, ok := first[p]; !ok {
				first[p] = seq
				took <- struct{}{}
			}
			return nil
		}}})
	if err != nil {
		t.Fatal(err)
	}
	c.WaitDirectGets(cfg.Name)
	held := c.Follower(cfg.Name)
	lag.Hold(held.Name())
	defer lag.Release()
	appendAll("b2") // the held replica has not these
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() { stop(); <-done }()
	// A recovery that ended at the held replica's end checkpoints then;
	// one that waits for the rest checkpoints after the release. The
	// release comes once no partition has checkpointed for a while: no
	// event marks a read that waits, and the check below holds either
	// way after it.
	n := 0
	for n < 16 {
		select {
		case <-took:
			n++
			continue
		case <-time.After(3 * time.Second):
		}
		break
	}
	lag.Release()
	for ; n < 16; n++ {
		select {
		case <-took:
		case <-ctx.Done():
			t.Fatalf("%d partitions checkpointed", n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for p, seq := range first {
		if seq < end[p] {
			t.Errorf("partition %d's first checkpoint at #%d, before its last input at #%d: its recovery ended at a replica's end", p, seq, end[p])
		}
	}
}
