package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestAStalledReadIsReadOn pauses the consumer a partition's session
// reads through: the server keeps it, and its idle heartbeats, but
// delivers nothing, as a consumption that went quiet after a server's
// loss without the client noticing (TestClusterChaos once: a partition
// planned nothing for 55 s, and logged nothing). A new want of the
// partition's node still gets its plan: the session, its read quiet for
// readStallAfter while its consumer holds the want, reads on through a
// new consumer, and says so at warn level; the other partition reads on
// untouched, and no session restarted.
func TestAStalledReadIsReadOn(t *testing.T) {
	t.Parallel()
	g := newRig(t, store.StreamConfig{Partitions: 2})
	nodes := append(nodesIn(2, 0, 1, 1), nodesIn(2, 1, 2, 1)...)
	logs := newLogRecords()
	metrics := engine.NewMetrics(nil)
	cfg := engine.ReconcilerConfig{Metrics: metrics, SnapshotEvery: 3, SnapshotInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewMultiHandler(testLogger(t).Handler(), logs))}
	engine.SetReadStallAfter(&cfg, 300*time.Millisecond)
	g.startCfg(cfg)
	for _, n := range nodes {
		g.planFor(n, g.append(n, want("pg:1")))
	}
	g.pauseRead(0)
	stalls := func() int {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		n := 0
		for _, r := range *logs.recs {
			if r.Level == slog.LevelWarn && strings.HasPrefix(r.Message, "partition read stalled") {
				n++
			}
		}
		return n
	}
	before := stalls()
	for _, n := range nodes {
		g.planFor(n, g.append(n, want("pg:2")))
	}
	if n := stalls() - before; n < 1 {
		t.Fatalf("%d stalled reads logged, want 1 or more", n)
	}
	if n := counter(metrics.Restarts); n != 0 {
		t.Fatalf("%v session restarts, want none: a stalled read is read on, its state kept", n)
	}
}

// pauseRead pauses the consumer partition p's session reads through, for
// an hour: the server keeps it and its heartbeats, and delivers nothing.
func (g *rig) pauseRead(p int) {
	g.t.Helper()
	filter := g.cfg.Subjects().StoredPartitionAll(p)
	waitfor.Until(g.t, 20*time.Second, fmt.Sprintf("partition %d's consumer paused", p), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		infos, err := storetest.Consumers(ctx, g.stream)
		if err != nil {
			g.t.Logf("list consumers: %v", err)
			return false
		}
		// Every consumer of the partition's filter: another one can
		// stand beside the read for a moment (a read moved earlier,
		// whose consumer's deletion is asked aside, or left to its
		// inactive threshold). Pausing only the first listed is the
		// likeliest way the read ran on in a landing CI: the plan came
		// with no read moved.
		paused := 0
		for _, info := range infos {
			if info.Config.FilterSubject != filter {
				continue
			}
			if _, err := g.js.PauseConsumer(ctx, g.cfg.Name, info.Name, time.Now().Add(time.Hour)); err != nil {
				g.t.Logf("pause %s: %v", info.Name, err)
				return false
			}
			paused++
		}
		return paused > 0
	})
}

// TestAFollowThatNeverAnswersEndsTheSession pauses partition 0's
// consumer, and from then on every request creating its read's consumer
// again hangs for 3 s and fails, until a session restarted: the session,
// its read stalled, reads on (readStalled) through attempts that all
// fail, asked one after another. It stops asking after followRideOut,
// ends, and restarts from its snapshot, whose consumer is made: the new
// want gets its plan. Before,
// such attempts were started for as long as they failed, never all ended
// at once, and the session waited without end, and without a word. While
// it waits, it says where (watchTurns): at warn level, in the step of
// creating its read's consumer.
func TestAFollowThatNeverAnswersEndsTheSession(t *testing.T) {
	t.Parallel()
	g := newRig(t, store.StreamConfig{Partitions: 2})
	nodes := append(nodesIn(2, 0, 1, 1), nodesIn(2, 1, 2, 1)...)
	metrics := engine.NewMetrics(nil)
	logs := newLogRecords()
	var hang atomic.Bool
	cfg := engine.ReconcilerConfig{Metrics: metrics, SnapshotEvery: 3, SnapshotInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewMultiHandler(testLogger(t).Handler(), logs)), Faults: engine.Faults{BeforeFollow: func(p int, _ uint64) error {
			if p != 0 || !hang.Load() || counter(metrics.Restarts) > 0 {
				return nil
			}
			time.Sleep(3 * time.Second)
			return fmt.Errorf("consumer on MESH: %w", context.DeadlineExceeded)
		}}}
	engine.SetReadStallAfter(&cfg, 300*time.Millisecond)
	engine.SetFollowRideOut(&cfg, time.Second)
	g.startCfg(cfg)
	for _, n := range nodes {
		g.planFor(n, g.append(n, want("pg:1")))
	}
	hang.Store(true)
	g.pauseRead(0)
	for _, n := range nodes {
		g.planFor(n, g.append(n, want("pg:2")))
	}
	if n := counter(metrics.Restarts); n < 1 {
		t.Fatalf("%v session restarts, want 1 or more", n)
	}
	if n := logs.count("creating its read's consumer", "step"); n < 1 {
		t.Fatalf("%d lines saying the session waits in creating its read's consumer, want 1 or more", n)
	}
}

// TestARefollowAsksOneAtATime: a session whose read stalled asks for its
// new consumer one request at a time, as store.AskAgain asks: here the
// first two creations of partition 0's consumer hang for 1.5 s (past the
// first attempt's 1 s) and fail, as creations sent into a meta leader's
// election do. Before, a creation unanswered after 500 ms had another
// started beside it, up to ten per partition (160 in flight for 16
// partitions in one election, BenchmarkLeaderFailover's log), each one
// answered late leaving a consumer on the server. The read still goes on
// (the new want gets its plan) and no session restarts.
func TestARefollowAsksOneAtATime(t *testing.T) {
	t.Parallel()
	g := newRig(t, store.StreamConfig{Partitions: 2})
	nodes := append(nodesIn(2, 0, 1, 1), nodesIn(2, 1, 2, 1)...)
	metrics := engine.NewMetrics(nil)
	var hang atomic.Bool
	var inflight, most, failed atomic.Int64
	cfg := engine.ReconcilerConfig{Metrics: metrics, SnapshotEvery: 3, SnapshotInterval: 20 * time.Millisecond,
		Logger: testLogger(t), Faults: engine.Faults{BeforeFollow: func(p int, _ uint64) error {
			if p != 0 || !hang.Load() || failed.Load() >= 2 {
				return nil
			}
			n := inflight.Add(1)
			defer inflight.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(1500 * time.Millisecond) // a creation nobody answers
			failed.Add(1)
			return fmt.Errorf("consumer on MESH: %w", context.DeadlineExceeded)
		}}}
	engine.SetReadStallAfter(&cfg, 300*time.Millisecond)
	g.startCfg(cfg)
	for _, n := range nodes {
		g.planFor(n, g.append(n, want("pg:1")))
	}
	hang.Store(true)
	g.pauseRead(0)
	for _, n := range nodes {
		g.planFor(n, g.append(n, want("pg:2")))
	}
	if f := failed.Load(); f < 2 {
		t.Fatalf("%d creations hung, want 2: the stalled read was not asked for again", f)
	}
	if m := most.Load(); m != 1 {
		t.Errorf("%d creations of partition 0's consumer in flight at once, want 1", m)
	}
	if n := counter(metrics.Restarts); n != 0 {
		t.Errorf("%v session restarts, want none: the read goes on once a creation is answered", n)
	}
}
