package engine_test

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// logRecords is a slog handler that keeps every record, for tests that
// count log lines.
type logRecords struct {
	mu   *sync.Mutex
	recs *[]slog.Record
}

func newLogRecords() logRecords { return logRecords{mu: &sync.Mutex{}, recs: &[]slog.Record{}} }

func (h logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h logRecords) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.recs = append(*h.recs, r.Clone())
	return nil
}
func (h logRecords) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h logRecords) WithGroup(string) slog.Handler      { return h }

// count returns how many records at warn or above have an attribute key
// whose value is v, among the given keys.
func (h logRecords) count(v string, keys ...string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range *h.recs {
		if r.Level < slog.LevelWarn {
			continue
		}
		r.Attrs(func(a slog.Attr) bool {
			for _, k := range keys {
				if a.Key == k && a.Value.String() == v {
					n++
					return false
				}
			}
			return true
		})
	}
	return n
}

// crashAt returns faults that stop the reconciler as a crash would when
// the event at *seq is folded (0: never).
func crashAt(seq *uint64, mu *sync.Mutex) engine.Faults {
	return engine.Faults{AfterFold: func(_ int, s uint64) error {
		mu.Lock()
		defer mu.Unlock()
		if *seq != 0 && s == *seq {
			return errors.New("crash")
		}
		return nil
	}}
}

func (g *rig) startCfg(cfg engine.ReconcilerConfig) *running {
	g.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cfg.Stream = g.cfg
	r, err := engine.NewReconciler(ctx, g.js, cfg)
	if err != nil {
		g.t.Fatal(err)
	}
	rn := &running{r: r, cancel: cancel, done: make(chan error, 1)}
	go func() { rn.done <- r.Run(ctx) }()
	g.t.Cleanup(func() { cancel(); <-rn.done })
	return rn
}

var fleetCount = regexp.MustCompile(`^(\d+) event\(s\) on subjects that name no valid node`)

// fleetEntries returns the fleet journal's entries and the events they
// count.
func (g *rig) fleetEntries() (entries, counted int) {
	for _, m := range g.all() {
		if m.Event.Node != events.FleetNode {
			continue
		}
		j, ok := m.Event.Payload.(*events.Journal)
		if !ok {
			g.t.Fatalf("fleet journal message %d: %v", m.Event.Seq, m.Event.Err)
		}
		sub := fleetCount.FindStringSubmatch(j.Msg)
		if sub == nil {
			g.t.Fatalf("fleet journal entry %q", j.Msg)
		}
		n, _ := strconv.Atoi(sub[1])
		entries++
		counted += n
	}
	return entries, counted
}

// Events on subjects whose node token is no valid name are counted and
// journaled on the fleet-wide journal, a few entries for a flood; a
// restart after the checkpoint covers them notes them neither in the
// journal nor in the log again.
func TestBadSubjectsOnTheFleetJournal(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	g := newRig(t, store.StreamConfig{})
	bad := []string{"mesh.ACE.want", "mesh.über.have", "mesh.-x.settle", "mesh._fleet.want"}
	const flood = 40
	for i := range flood {
		if _, err := g.js.Publish(ctx, bad[i%len(bad)], []byte(`{"v":1}`)); err != nil {
			t.Fatal(err)
		}
	}
	logs := newLogRecords()
	var mu sync.Mutex
	var crash uint64
	metrics := engine.NewMetrics(nil)
	cfg := engine.ReconcilerConfig{Faults: crashAt(&crash, &mu), SnapshotInterval: 20 * time.Millisecond,
		FleetJournalEvery: 50 * time.Millisecond, Logger: slog.New(logs), Metrics: metrics}
	rn := g.startCfg(cfg)
	eventually(t, "the fleet journal to count the flood", func() bool {
		_, n := g.fleetEntries()
		return n == flood
	})
	entries, _ := g.fleetEntries()
	if entries > flood/4 {
		t.Errorf("%d fleet journal entries for %d events: not rate-limited", entries, flood)
	}
	if got := counter(metrics.BadSubject); got != flood {
		t.Errorf("bad-subject counter %v, want %d", got, flood)
	}
	snaps, err := store.OpenSnapshots(ctx, g.js, g.cfg)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "checkpoints past the flood", func() bool {
		folded := uint64(0)
		for p, seq := range rn.r.Progress() {
			if ck, err := snaps.Checkpoint(ctx, p); err != nil || ck < seq {
				return false
			}
			folded = max(folded, seq)
		}
		return folded >= flood
	})
	mu.Lock()
	crash = g.append("ace", want("pg:1"))
	last := crash
	mu.Unlock()
	if err := rn.wait(t); err == nil || !strings.Contains(err.Error(), "crash") {
		t.Fatalf("run ended with %v, want the crash", err)
	}
	mu.Lock()
	crash = 0
	mu.Unlock()
	rn2 := g.startCfg(cfg)
	eventually(t, "the second run to fold past the crash", func() bool {
		st, ok := rn2.r.Node("ace")
		return ok && st.Seq >= last
	})
	rn2.stop(t) // its last fleet entry, if any, is written on the way out
	if got, _ := g.fleetEntries(); got != entries {
		t.Errorf("the restart wrote %d more fleet journal entries", got-entries)
	}
	logged := 0
	logs.mu.Lock()
	for _, r := range *logs.recs {
		if strings.Contains(r.Message, "subjects that name no valid node") {
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "count" {
					logged += int(a.Value.Int64())
				}
				return true
			})
		}
	}
	logs.mu.Unlock()
	if logged != flood {
		t.Errorf("the log counts %d events on bad subjects over both runs, want %d", logged, flood)
	}
}

// A rejected event is logged once, with its journal entry, and not again
// when a restart refolds it.
func TestRejectionLoggedOnce(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	g := newRig(t, store.StreamConfig{})
	ack, err := g.js.Publish(ctx, "mesh.ace.have", []byte(`{"v":1,"at":"2026-12-01T12:00:00Z","modules":[{"name":"pg","state":"gone"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	bad := ack.Sequence
	logs := newLogRecords()
	var mu sync.Mutex
	var crash uint64
	cfg := engine.ReconcilerConfig{Faults: crashAt(&crash, &mu), SnapshotEvery: 1 << 20, SnapshotInterval: time.Hour, Logger: slog.New(logs)}
	rn := g.startCfg(cfg)
	eventually(t, "the rejection's journal entry", func() bool {
		m, err := store.LastMsg(ctx, g.stream, g.cfg.Subjects(), "ace", events.KindJournal)
		return err == nil && m.Event.Payload.(*events.Journal).Cause == bad
	})
	mu.Lock()
	crash = g.append("ace", want("pg:1"))
	last := crash
	mu.Unlock()
	if err := rn.wait(t); err == nil {
		t.Fatal("run ended without the crash")
	}
	mu.Lock()
	crash = 0
	mu.Unlock()
	rn2 := g.startCfg(cfg)
	eventually(t, "the second run to fold past the crash", func() bool {
		st, ok := rn2.r.Node("ace")
		return ok && st.Seq >= last
	})
	s := strconv.FormatUint(bad, 10)
	if n := logs.count(s, "seq", "cause"); n != 1 {
		t.Errorf("the rejection of event %d was logged %d times over a crash and a refold, want once", bad, n)
	}
}

// Unsaved is empty after a clean stop and names the partitions whose
// final snapshot could not be written (the server gone), so that serve
// says "snapshots written" only when they were.
func TestUnsavedSnapshots(t *testing.T) {
	t.Parallel()
	e, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	g := &rig{t: t, js: js, stream: stream, cfg: cfg, pub: store.NewPublisher(js, cfg.Subjects())}
	rn := g.startCfg(engine.ReconcilerConfig{SnapshotInterval: time.Hour, SnapshotEvery: 1 << 20, Logger: testLogger(t)})
	g.planFor("ace", g.append("ace", want("pg:1")))
	rn.stop(t)
	if u := rn.r.Unsaved(); len(u) != 0 {
		t.Fatalf("a clean stop left %v unsaved", u)
	}
	rn = g.startCfg(engine.ReconcilerConfig{SnapshotInterval: time.Hour, SnapshotEvery: 1 << 20, Logger: testLogger(t)})
	g.planFor("ace", g.append("ace", want("pg:2")))
	e.Shutdown()
	rn.stopWithin(t, deadStopWait) // no election to ride out (one replica)
	u := rn.r.Unsaved()
	if _, ok := u[events.Partition("ace", cfg.Partitions)]; !ok {
		t.Fatalf("the server stopped before the final snapshot, and Unsaved is %v", u)
	}
}

// Events removed from the stream before they were folded (an age limit)
// are detected when a partition's session starts (the stream begins past
// its checkpoint + 1) and journaled on the fleet journal, once.
func TestAgedOutDetected(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	g := newRig(t, store.StreamConfig{})
	g.append("ace", want("pg:1"))
	g.append("ace", want("pg:2"))
	keep := g.append("ace", want("pg:3"))
	if err := g.stream.Purge(ctx, jetstream.WithPurgeSequence(keep)); err != nil {
		t.Fatal(err)
	}
	rn := g.startCfg(engine.ReconcilerConfig{SnapshotInterval: 20 * time.Millisecond, Logger: testLogger(t)})
	g.planFor("ace", keep)
	aged := func() int {
		n := 0
		for _, m := range g.all() {
			if j, ok := m.Event.Payload.(*events.Journal); ok && m.Event.Node == events.FleetNode && strings.Contains(j.Msg, "aged out") {
				n++
			}
		}
		return n
	}
	eventually(t, "the aged-out entry", func() bool { return aged() > 0 })
	rn.stop(t)
	if n := aged(); n != 1 {
		t.Errorf("%d aged-out entries, want 1", n)
	}
}
