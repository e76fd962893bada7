package engine_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestRecoveryEndRidesOutALeaderKill kills, with SIGKILL, the server
// leading the stream of a 3-server cluster of nats-server processes at
// the moment a partition's recovery asks the stream's leader for the
// partition's last message (its consumer reported nothing pending short
// of the stream's end at its start: the partition's last message came
// before another partition's). The read rides out the election (a new
// leader after 4-9 s), the recovery ends, its plans are stored and it
// checkpoints, and no session restarts: the read failed and the session
// refolded from its snapshot (reviewer's finding).
func TestRecoveryEndRidesOutALeaderKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills a server and waits for an election: not in -short")
	}
	pc := storetest.StartProcCluster(t, 3)
	_, js := pc.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stream, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3, Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	g := &rig{t: t, js: js, stream: stream, cfg: cfg, pub: store.NewPublisher(js, cfg.Subjects()), wait: time.Minute}
	nodes := nodesIn(2, 0, 1, 20)
	causes := map[string]uint64{}
	var last uint64
	for _, n := range nodes {
		last = g.append(n, want("pg:1"))
		causes[n] = last
	}
	g.append(nodesIn(2, 1, 2, 1)[0], want("pg:1")) // the stream's end, in partition 1
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	killed := make(chan string, 1)
	metrics := engine.NewMetrics(nil)
	g.startCfg(engine.ReconcilerConfig{Metrics: metrics, Logger: testLogger(t),
		Faults: engine.Faults{AfterFold: func(p int, seq uint64) error {
			if p == 0 && seq == last {
				once.Do(func() {
					i := pc.Leader(ctx, js, cfg.Name)
					if i < 0 {
						t.Error("the stream has no leader")
						return
					}
					pc.Kill(i)
					killed <- pc.Name(i)
				})
			}
			return nil
		}}})
	select {
	case name := <-killed:
		t.Logf("killed %s, the stream's leader, at partition 0's last message #%d", name, last)
	case <-ctx.Done():
		t.Fatal("partition 0 never folded its last message")
	}
	waitfor.Until(t, time.Minute, "partition 0's checkpoint at its recovery's end", func() bool {
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		ck, err := snaps.Checkpoint(qctx, 0)
		return err == nil && ck >= last
	})
	for _, n := range nodes {
		g.planFor(n, causes[n])
	}
	if n := counter(metrics.Restarts); n != 0 {
		t.Fatalf("%v session restarts across the election, want none", n)
	}
}
