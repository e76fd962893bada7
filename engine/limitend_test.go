package engine_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/store"
)

// TestRecoveryEndsWhenALimitRemovesItsRest: a partition's recovery whose
// remaining messages a limit removes while it reads, before its consumer
// delivered them (the stream's MaxMsgs set to 1 at its first fold: the
// client had pulled one batch, 500), ends once it is idle and the
// stream's leader holds nothing of the partition past what it folded:
// it publishes what it deferred and checkpoints. It waited for a
// message past the stream's end at its start, which may never come, its
// effects unpublished meanwhile (reviewer's finding).
func TestRecoveryEndsWhenALimitRemovesItsRest(t *testing.T) {
	t.Parallel()
	g := newRig(t, store.StreamConfig{Partitions: 2})
	ctx := testCtx(t)
	var futures []jetstream.PubAckFuture
	for _, n := range nodesIn(2, 0, 1, 3000) {
		f, err := g.pub.AppendAsync(ctx, n, want("pg:1"))
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	g.append(nodesIn(2, 1, 2, 1)[0], want("pg:1")) // the stream's end, in partition 1
	var once sync.Once
	trim := func() {
		c := g.stream.CachedInfo().Config
		c.MaxMsgs = 1
		if _, err := g.js.UpdateStream(context.Background(), c); err != nil {
			t.Error(err)
		}
	}
	var (
		mu     sync.Mutex
		folded uint64
	)
	g.startCfg(engine.ReconcilerConfig{SnapshotInterval: 20 * time.Millisecond, Logger: testLogger(t),
		Faults: engine.Faults{AfterFold: func(p int, seq uint64) error {
			if p == 0 && seq <= 3000 { // its inputs, not its plans read back
				once.Do(trim)
				mu.Lock()
				folded = max(folded, seq)
				mu.Unlock()
			}
			return nil
		}}})
	snaps, err := store.OpenSnapshots(ctx, g.js, g.cfg)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "partition 0's checkpoint at the end of its recovery", func() bool {
		ck, err := snaps.Checkpoint(context.Background(), 0)
		return err == nil && ck > 0
	})
	mu.Lock()
	defer mu.Unlock()
	if folded >= 3000 {
		t.Fatalf("partition 0 folded up to #%d: the limit removed nothing it had not read", folded)
	}
}
