package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/store"
)

// serveLaggingReconciler runs the reconciler on m as serve does, but
// with checkpoints so far apart that none is written while the test
// runs: its snapshots stay as they were at its start, as they are for a
// few seconds after any change (states are put some checkpoints later),
// and longer after a restart.
func (m *mesh) serveLaggingReconciler(t *testing.T) {
	t.Helper()
	nc, err := m.e.Connect(nats.Name("reconciler"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- engine.Serve(ctx, nc, engine.Config{Stream: m.cfg, SnapshotEvery: 1 << 30, SnapshotInterval: time.Hour,
			Ready: func(context.Context, *engine.Reconciler) { close(ready) }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("reconciler: %v", err)
		}
		nc.Close()
	})
	select {
	case <-ready:
	case err := <-done:
		done <- err
		t.Fatalf("reconciler did not start: %v", err)
	case <-testCtx(t).Done():
		t.Fatal("reconciler not up in time")
	}
}

// `meshfold fleet` right after a change (issue 27's README run: "0
// nodes" while `state ace` showed ace live; a retired node not
// retiring): the snapshots lag the stream, so the table reads the nodes
// with events past them live from the reconciler, and says how current
// it is. -o json keeps the snapshots' one pass and says on stderr that
// they lag.
func TestFleetReadsLiveWhatTheSnapshotsLag(t *testing.T) {
	m := startMesh(t)
	m.serveLaggingReconciler(t)
	ctx := testCtx(t)
	r, err := query.New(m.nc, query.Config{Stream: m.cfg})
	if err != nil {
		t.Fatal(err)
	}
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	want := func(node string) {
		t.Helper()
		if _, err := pub.Append(ctx, node, events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1", RunsAs: "nobody"}}}, time.Now())); err != nil {
			t.Fatal(err)
		}
		waitfor.Until(t, time.Minute, "the reconciler to plan "+node, func() bool {
			v, err := r.LiveView(ctx, node)
			return err == nil && v.EmittedPlan > 0
		})
	}
	// ace's first state may be stored at the reconciler's first
	// checkpoint; after that none is written while the test runs.
	want("ace")
	if _, errs, code := m.cli(t, "retire", "ace", "--by", "alice"); code != 0 {
		t.Fatalf("retire ace: exit %d %s", code, errs)
	}
	waitfor.Until(t, time.Minute, "the reconciler to fold ace's retirement", func() bool {
		v, err := r.LiveView(ctx, "ace")
		return err == nil && v.Retire != nil
	})
	want("bob")
	snaps := snapsOf(t, m)
	if data, _, err := snaps.GetNode(ctx, "ace"); err == nil && strings.Contains(string(data), "retire") {
		t.Fatal("ace's retirement is in its snapshot: the test needs the snapshots to lag")
	}
	if _, _, err := snaps.GetNode(ctx, "bob"); err == nil {
		t.Fatal("bob has a snapshot: the test needs the snapshots to lag")
	}

	out, errs, code := m.cli(t, "fleet")
	if code != 0 || !strings.Contains(rowOf(out, "ace"), "retiring") || !hasRow(out, "bob") || !strings.Contains(out, "-- 2 nodes, ") ||
		!strings.Contains(out, "-- as of the reconciler's snapshots") || !strings.Contains(out, "2 nodes with events past them read live from the reconciler (ace, bob)") {
		t.Fatalf("fleet while the snapshots lag: exit %d, want ace retiring and bob, read live and said so\n%s%s", code, out, errs)
	}
	out, errs, code = m.cli(t, "fleet", "-o", "json")
	if code != 0 || strings.Contains(out, `"node":"bob"`) || !strings.Contains(errs, "note: the snapshots lag the stream: ") ||
		!strings.Contains(errs, "'meshfold fleet' (the table) reads those nodes live") {
		t.Fatalf("fleet -o json while the snapshots lag: exit %d, want the snapshots' lines (no bob) and the note on stderr\n%s%s", code, out, errs)
	}
}

// With no reconciler to ask, the table says which nodes have events the
// snapshots do not hold, and that their rows may be older: never a
// silent "0 nodes".
func TestFleetSaysWhenTheSnapshotsLagAndNoReconcilerAnswers(t *testing.T) {
	m := startMesh(t)
	ctx := testCtx(t)
	snapsOf(t, m) // the bucket, empty: no checkpoint yet
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	if _, err := pub.Append(ctx, "ace", events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1", RunsAs: "nobody"}}}, time.Now())); err != nil {
		t.Fatal(err)
	}
	out, errs, code := m.cli(t, "fleet")
	for _, want := range []string{"-- 0 nodes, 0 need an operator\n", "(no partition checkpointed yet)",
		"the snapshots lag the stream: 1 node has events past them (ace), and no reconciler answered to read them live",
		"'meshfold state NODE' folds one from the stream"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("fleet: exit %d, does not say %q\n%s%s", code, want, out, errs)
		}
	}
	// Once checkpointed past every event, the table says it is current.
	last, err := store.StreamLastSeq(ctx, mustStream(t, m))
	if err != nil {
		t.Fatal(err)
	}
	for p := range m.cfg.Partitions {
		if err := snapsOf(t, m).PutCheckpoint(ctx, p, last); err != nil {
			t.Fatal(err)
		}
	}
	out, errs, code = m.cli(t, "fleet")
	if code != 0 || !strings.Contains(out, "-- as of the reconciler's snapshots, checkpointed ") || !strings.Contains(out, ": the stream holds no newer event\n") {
		t.Errorf("fleet, checkpointed: exit %d, want it said current\n%s%s", code, out, errs)
	}
	if _, errs, _ := m.cli(t, "fleet", "-o", "json"); strings.Contains(errs, "lag") {
		t.Errorf("fleet -o json, checkpointed: a lag note %q", errs)
	}
}

func snapsOf(t *testing.T, m *mesh) *store.Snapshots {
	t.Helper()
	s, err := store.OpenSnapshots(testCtx(t), m.js, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustStream(t *testing.T, m *mesh) jetstream.Stream {
	t.Helper()
	s, err := m.js.Stream(testCtx(t), m.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// rowOf returns the table row of node ("" when none).
func rowOf(out, node string) string {
	for l := range strings.Lines(out) {
		if f := strings.Fields(l); len(f) > 0 && f[0] == node {
			return l
		}
	}
	return ""
}

func hasRow(out, node string) bool { return rowOf(out, node) != "" }
