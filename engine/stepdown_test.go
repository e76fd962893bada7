package engine_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/internal/waitfor"
)

// TestStepdownsMoveNoRead steps the stream's leader down three times on
// a 3-server cluster (R3, 16 partitions) while four nodes play incident
// 1 and write-failure rounds. Each partition's consumer lives on a
// server that still runs, so it reads on across the change: a new
// leader moves a partition's read only when its consumer is gone or
// does not answer within 2 s (readGone), and here none should be (one
// in ten is allowed: an answer later than 2 s on a loaded machine).
// Before, each new leader moved all 16 reads to new consumers (48 here).
// And the publishes sent into the stepdowns are ridden out: no session
// ends, every effect is stored once (verify), every input acknowledged
// is stored. docs/architecture.md, "A new stream leader moves only the
// reads it took".
func TestStepdownsMoveNoRead(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a cluster and its elections: not in -short")
	}
	g, c := newClusterRig(t)
	m := engine.NewMetrics(prometheus.NewRegistry())
	var seen atomic.Int64 // the reconciler's "new leader" lines
	log := slog.New(&teeHandler{h: testLogger(t).Handler(), on: func(msg string) {
		if strings.HasPrefix(msg, "the stream has a new leader:") {
			seen.Add(1)
		}
	}})
	rn := g.startCfg(engine.ReconcilerConfig{Metrics: m, SnapshotEvery: 3, SnapshotInterval: 20 * time.Millisecond, Logger: log})
	nodes := []string{"ace", "shanks", "novox", "luffy"}
	const rounds, stepdowns = 3, 3
	errs := g.play(nodes, rounds)
	eventually(t, "incident 1 on every node", func() bool {
		for _, n := range nodes {
			if g.knocksOf(n) < 1 {
				return false
			}
		}
		return true
	})
	nc := g.js.Conn()
	for i := range stepdowns {
		from, to := c.StepDown(nc, g.cfg.Name)
		t.Logf("stepdown %d: %s to %s", i+1, from.Name(), to.Name())
		waitfor.Until(t, time.Minute, "the reconciler to see the new leader", func() bool { return seen.Load() >= int64(i+1) })
	}
	failures(t, errs)
	if t.Failed() {
		return
	}
	eventually(t, "every knock", func() bool {
		for _, n := range nodes {
			if g.knocksOf(n) != 1+rounds {
				return false
			}
		}
		return true
	})
	if k := g.verify(rn.r); k != len(nodes)*(1+rounds) {
		t.Fatalf("%d knocks, want %d", k, len(nodes)*(1+rounds))
	}
	g.checkAcked()
	elected := testutil.ToFloat64(m.ReadsMoved.WithLabelValues("elected"))
	t.Logf("reads moved: elected %v, lost %v, stalled %v; sessions restarted %v", elected,
		testutil.ToFloat64(m.ReadsMoved.WithLabelValues("lost")), testutil.ToFloat64(m.ReadsMoved.WithLabelValues("stalled")),
		testutil.ToFloat64(m.Restarts))
	if partitions := g.cfg.Partitions; elected*10 > float64(stepdowns*partitions) {
		t.Errorf("%v reads moved by %d new leaders of %d partitions, want none (at most %d)", elected, stepdowns, partitions, stepdowns*partitions/10)
	}
	if n := testutil.ToFloat64(m.Restarts); n != 0 {
		t.Errorf("%v sessions restarted across the stepdowns, want none", n)
	}
}

// teeHandler hands each record to h, and its message to on.
type teeHandler struct {
	h  slog.Handler
	on func(msg string)
}

func (t *teeHandler) Enabled(ctx context.Context, l slog.Level) bool { return t.h.Enabled(ctx, l) }
func (t *teeHandler) Handle(ctx context.Context, r slog.Record) error {
	t.on(r.Message)
	return t.h.Handle(ctx, r)
}
func (t *teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &teeHandler{h: t.h.WithAttrs(as), on: t.on}
}
func (t *teeHandler) WithGroup(n string) slog.Handler {
	return &teeHandler{h: t.h.WithGroup(n), on: t.on}
}

// TestAReadStalledAtAStepdownIsReadOn: a partition's read that holds input
// it does not deliver when the stream's leader changes (its consumer
// paused: the server keeps it and its heartbeats) is read on through a new
// consumer once it has been quiet for two heartbeats after the new
// leader's check found its consumer holding input (readGone), not after
// readStallAfter, set here to an hour: the plan of the want the consumer
// holds comes, and the read moved (as stalled, or under load as lost or
// elected). Without the shorter stall check it would wait the hour.
// That no read moves at a new leader without cause is
// TestStepdownsMoveNoRead's.
func TestAReadStalledAtAStepdownIsReadOn(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a cluster and its elections: not in -short")
	}
	g, c := newClusterRig(t)
	m := engine.NewMetrics(prometheus.NewRegistry())
	cfg := engine.ReconcilerConfig{Metrics: m, SnapshotEvery: 3, SnapshotInterval: 20 * time.Millisecond, Logger: testLogger(t)}
	engine.SetReadStallAfter(&cfg, time.Hour)
	g.startCfg(cfg)
	node := nodesIn(g.cfg.Partitions, 0, 1, 1)[0]
	g.planFor(node, g.append(node, want("pg:1")))
	g.pauseRead(0)
	seq := g.append(node, want("pg:2"))
	from, to := c.StepDown(g.js.Conn(), g.cfg.Name)
	t.Logf("stepdown: %s to %s", from.Name(), to.Name())
	g.planFor(node, seq)
	// The read moves as stalled here, or (on a loaded machine) as lost
	// (a heartbeat of the paused consumer missed across the stepdown:
	// seen once in 10 -race runs at load ~50, after the stall's move) or
	// as elected (the new leader's look at the consumer unanswered
	// within 2 s): each is the read moved on, and the plan came well
	// before the hour. Counting only "stalled" failed under load when
	// one of the others moved it first.
	stalled, lost, elected := testutil.ToFloat64(m.ReadsMoved.WithLabelValues("stalled")),
		testutil.ToFloat64(m.ReadsMoved.WithLabelValues("lost")), testutil.ToFloat64(m.ReadsMoved.WithLabelValues("elected"))
	t.Logf("reads moved: stalled %v, lost %v, elected %v", stalled, lost, elected)
	if stalled+lost+elected < 1 {
		t.Errorf("no read moved (stalled %v, lost %v, elected %v), want 1 or more", stalled, lost, elected)
	}
	if n := testutil.ToFloat64(m.Restarts); n != 0 {
		t.Errorf("%v sessions restarted, want none", n)
	}
}
