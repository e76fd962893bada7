package engine_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// members answers for a node from whichever member folds it.
type members []*member

func (ms members) Node(node string) (*reconcile.State, bool) {
	for _, m := range ms {
		if st, ok := m.r.Node(node); ok {
			return st, true
		}
	}
	return nil, false
}

// owned counts the partitions the members' groups hold and their
// reconcilers fold.
func (ms members) owned() (leases, folded int) {
	for _, m := range ms {
		leases += len(m.g.Owned())
		folded += len(m.r.Owned())
	}
	return leases, folded
}

// chaosKill is one kind of kill of TestClusterChaos: the server leading
// the replica group of stream.
type chaosKill struct{ what, stream string }

// TestClusterChaos kills, with SIGKILL, the server leading the stream,
// then the one leading the lease bucket, then the snapshot bucket's,
// twice in a row, on a 3-server cluster of real nats-server processes
// under a group of two reconcilers with the default lease TTL, while
// nodes play their histories. A crashed leader's peers elect a new one
// only when their election timers fire (4–10 s here). After each kill,
// a new want of every node gets its plan, every partition is owned again
// and every node answers the state service; the killed server is then
// restarted. At the end nothing acknowledged is lost, every effect the
// fold makes is stored exactly once, and the members' states are the
// pure fold of the stream.
func TestClusterChaos(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills servers and waits for elections: not in -short")
	}
	pc := storetest.StartProcCluster(t, 3)
	_, js := pc.Connect(t)
	ctx := testCtx(t)
	stream, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	g := &rig{t: t, js: js, stream: stream, cfg: cfg, pub: store.NewPublisher(js, cfg.Subjects()), wait: time.Minute}
	ms := members{
		startMember(t, pc.Connect, cfg, "a", engine.DefaultLeaseTTL, engine.Faults{}),
		startMember(t, pc.Connect, cfg, "b", engine.DefaultLeaseTTL, engine.Faults{}),
	}
	for _, m := range ms {
		svc, err := engine.AddStateService(m.nc, m.r.Node, engine.StateServiceConfig{Partial: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = svc.Stop() })
		var _ micro.Service = svc
	}
	client, _ := pc.Connect(t)
	eventually(t, "8 partitions each", func() bool {
		return len(ms[0].g.Owned()) == 8 && len(ms[1].g.Owned()) == 8 && len(ms[0].r.Owned()) == 8 && len(ms[1].r.Owned()) == 8
	})
	nodes := append(nodesIn(cfg.Partitions, 0, 8, 2), nodesIn(cfg.Partitions, 8, 16, 2)...)
	for _, n := range nodes {
		g.incident1(n)
	}
	kinds := []chaosKill{
		{"stream", cfg.Name},
		{"lease bucket", "KV_" + cfg.Name + engine.LeaseBucketSuffix},
		{"snapshot bucket", "KV_" + cfg.Name + store.SnapshotBucketSuffix},
	}
	build := 0
	for round := range 2 {
		for _, k := range kinds {
			leader := -1
			waitfor.Until(t, time.Minute, "a leader of "+k.stream, func() bool {
				qctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				leader = pc.Leader(qctx, js, k.stream)
				return leader >= 0
			})
			killed := time.Now()
			pc.Kill(leader)
			build++
			// A new want of every node, sent at once: each gets its plan.
			var wg sync.WaitGroup
			var mu sync.Mutex
			var slowest time.Duration
			errs := make(chan error, len(nodes))
			for _, n := range nodes {
				wg.Add(1)
				go func() { // reports through errs: t.Fatal ends only the test's goroutine
					defer wg.Done()
					w := provAndBroker()
					w.Modules[1].Build = fmt.Sprintf("g:chaos-%d", build)
					seq, err := g.tryAppend(context.Background(), n, w, nil)
					if err == nil {
						_, err = g.tryPlanFor(context.Background(), n, seq)
					}
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					slowest = max(slowest, time.Since(killed))
					mu.Unlock()
				}()
			}
			wg.Wait()
			close(errs)
			failures(t, errs)
			if t.Failed() {
				return
			}
			waitfor.Until(t, time.Minute, "every partition owned", func() bool {
				leases, folded := ms.owned()
				return leases == cfg.Partitions && folded == cfg.Partitions
			})
			owned := time.Since(killed)
			waitfor.Until(t, time.Minute, "every node to answer state", func() bool {
				for _, n := range nodes {
					qctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
					_, _, err := query.RequestState(qctx, client, events.DefaultPrefix, n, time.Second)
					cancel()
					if err != nil {
						return false
					}
				}
				return true
			})
			t.Logf("round %d, killed %s (leading the %s): every new want planned after %v, every partition owned after %v, every node answering after %v",
				round+1, pc.Name(leader), k.what, slowest.Round(time.Millisecond), owned.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
			pc.Restart(leader)
		}
	}
	// A knock through the whole history: a write failure after the last
	// kill, knocked once.
	for _, n := range nodes {
		g.rounds(n, 1)
	}
	// The last kill's bucket (the snapshots') may still be electing: the
	// knocks above no longer wait for it (a live checkpoint's puts ride
	// out an election beside the fold), and verify opens it.
	for _, k := range kinds {
		waitfor.Until(t, time.Minute, "a leader of "+k.stream, func() bool {
			qctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			return pc.Leader(qctx, js, k.stream) >= 0
		})
	}
	if k := g.verify(ms); k != 2*len(nodes) {
		t.Fatalf("%d knocks, want %d", k, 2*len(nodes))
	}
	g.checkAcked()
}
