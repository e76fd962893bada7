package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
	"github.com/meshfold/meshfold/store"
)

// `meshfold fleet` right after a change (issue 27's README run: "0
// nodes" while `state ace` showed ace live; a retired node not
// retiring): the snapshots lag the stream (here, as the reconciler
// leaves them a few checkpoints after a change: ace's stored state is
// from before its retirement, bob has none, and every checkpoint is
// before both), so the table reads the nodes with events past them live
// from the state service, and says how current it is. -o json keeps the
// snapshots' one pass and says on stderr that they lag.
func TestFleetReadsLiveWhatTheSnapshotsLag(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	ctx := testCtx(t)
	s := reconciletest.New(time.Now().Add(-time.Minute), time.Millisecond)
	web := []events.WantModule{{Name: "web", Build: "web:1", RunsAs: "nobody"}}
	s.Append("ace", &events.Want{Modules: web})
	stored := s.State("ace").Clone()
	checkpoint := s.Next() - 1 // after ace's want and its plan
	s.Append("ace", &events.Retire{By: "alice"})
	s.Append("bob", &events.Want{Modules: web})
	m.publish(t, s)

	snaps := snapsOf(t, m)
	data, err := reconcile.MarshalState(stored)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := reconcile.MarshalSummary(stored)
	if err != nil {
		t.Fatal(err)
	}
	p := events.Partition("ace", m.cfg.Partitions)
	if err := snaps.PutSummarizedAt(ctx, p, map[string][]byte{"ace": data}, map[string][]byte{"ace": sum}, nil); err != nil {
		t.Fatal(err)
	}
	for p := range m.cfg.Partitions {
		if err := snaps.PutCheckpoint(ctx, p, checkpoint); err != nil {
			t.Fatal(err)
		}
	}
	// The state service answers with each node's live state, as the
	// reconciler's would.
	if _, err := engine.AddStateService(m.nc, func(node string) (*reconcile.State, bool) {
		if node != "ace" && node != "bob" {
			return nil, false
		}
		return s.State(node).Clone(), true
	}, engine.StateServiceConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := m.nc.Flush(); err != nil {
		t.Fatal(err)
	}

	out, errs, code := m.cli(t, "fleet")
	if code != 0 || !strings.Contains(rowOf(out, "ace"), "retiring") || !hasRow(out, "bob") || !strings.Contains(out, "-- 2 nodes, ") ||
		!strings.Contains(out, "-- as of the reconciler's snapshots, checkpointed ") ||
		!strings.Contains(out, "2 nodes with events past them read live from the reconciler (ace, bob)") {
		t.Fatalf("fleet while the snapshots lag: exit %d, want ace retiring and bob, read live and said so\n%s%s", code, out, errs)
	}
	out, errs, code = m.cli(t, "fleet", "-o", "json")
	if code != 0 || !strings.Contains(out, `"node":"ace"`) || strings.Contains(out, `"node":"bob"`) ||
		!strings.Contains(errs, "note: the snapshots lag the stream: ") || !strings.Contains(errs, "'meshfold fleet' (the table) reads those nodes live") {
		t.Fatalf("fleet -o json while the snapshots lag: exit %d, want the snapshots' lines (ace, no bob) and the note on stderr\n%s%s", code, out, errs)
	}
	// Its line says it is from a snapshot older than the node's events
	// (a line at "seq 2, want 0" seconds after a want looked wrong, the
	// note on stderr apart), with the newest event's sequence.
	var row struct {
		Seq       uint64 `json:"seq"`
		Behind    bool   `json:"behind"`
		NewestSeq uint64 `json:"newest_seq"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &row); err != nil {
		t.Fatal(err)
	}
	if !row.Behind || row.NewestSeq <= row.Seq || row.NewestSeq < checkpoint || !strings.Contains(errs, `those lines say "behind":true, with the newest event's "newest_seq"`) {
		t.Errorf("fleet -o json: ace's line at seq %d says behind %v, newest_seq %d (checkpoint %d); want behind, past it\n%s%s", row.Seq, row.Behind, row.NewestSeq, checkpoint, out, errs)
	}
	// Once the checkpoints are at the stream's end, no line is behind.
	for p := range m.cfg.Partitions {
		if err := snaps.PutCheckpoint(ctx, p, s.Next()-1); err != nil {
			t.Fatal(err)
		}
	}
	if out, errs, code := m.cli(t, "fleet", "-o", "json"); code != 0 || strings.Contains(out, `"behind"`) || strings.Contains(errs, "lag") {
		t.Errorf("fleet -o json with current checkpoints: exit %d, a line or the note says it lags\n%s%s", code, out, errs)
	}
}

// With no reconciler to ask, the table says so first, and folds here the
// nodes with events the snapshots do not hold (ace, which no snapshot
// holds yet, from its events): never a silent "0 nodes".
func TestFleetSaysWhenTheSnapshotsLagAndNoReconcilerAnswers(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	ctx := testCtx(t)
	snapsOf(t, m) // the bucket, empty: no checkpoint yet
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	if _, err := pub.Append(ctx, "ace", events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1", RunsAs: "nobody"}}}, time.Now())); err != nil {
		t.Fatal(err)
	}
	out, errs, code := m.cli(t, "fleet")
	for _, want := range []string{"-- NO RECONCILER ANSWERS for the nodes of partition ", "-- 1 node, 1 needs an operator, and no reconciler answers (the first line)\n",
		"(no partition checkpointed yet)", "1 node with events past them folded here from the stream, no reconciler answering (ace)"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("fleet: exit %d, does not say %q\n%s%s", code, want, out, errs)
		}
	}
	if !hasRow(out, "ace") {
		t.Errorf("fleet: no row of ace, folded from its events\n%s%s", out, errs)
	}
	// Once checkpointed past every event, the table says it is current.
	checkpointAll(ctx, t, m)
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

// A node's state and a checkpoint past its newest event put while fleet
// reads (a reviewer's finding): fleet reads the checkpoints before the
// snapshots, so the state put after the checkpoints' read is in the
// snapshot it reads, or the node's event is past the checkpoint it read
// and the row is read live. Read the other way round, the snapshot held
// ace's old state, the checkpoint read after it covered ace's retirement,
// and the table showed ace not retiring while saying the stream held no
// newer event (a reconciler answering: fleet had no reason to ask it).
// The puts happen in fleetLagRead, between the two reads, as the
// reconciler makes them: the states, then the checkpoint.
func TestFleetReadsTheCheckpointsBeforeTheSnapshots(t *testing.T) {
	// Not parallel: it sets the package-level hook fleetLagRead.
	m := startMesh(t)
	ctx := testCtx(t)
	s := reconciletest.New(time.Now().Add(-time.Minute), time.Millisecond)
	s.Append("ace", &events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1", RunsAs: "nobody"}}})
	before := s.State("ace").Clone()
	checkpoint := s.Next() - 1 // after ace's want and its plan
	s.Append("ace", &events.Retire{By: "alice"})
	after := s.State("ace").Clone()
	m.publish(t, s)
	snaps := snapsOf(t, m)
	p := events.Partition("ace", m.cfg.Partitions)
	put := func(st *reconcile.State, seq uint64) {
		t.Helper()
		data, err := reconcile.MarshalState(st)
		if err != nil {
			t.Fatal(err)
		}
		sum, err := reconcile.MarshalSummary(st)
		if err != nil {
			t.Fatal(err)
		}
		if err := snaps.PutSummarizedAt(ctx, p, map[string][]byte{"ace": data}, map[string][]byte{"ace": sum}, nil); err != nil {
			t.Fatal(err)
		}
		for p := range m.cfg.Partitions {
			if err := snaps.PutCheckpoint(ctx, p, seq); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The state service answers with ace's live state, as the
	// reconciler's would: a row behind its events is read live.
	if _, err := engine.AddStateService(m.nc, func(node string) (*reconcile.State, bool) {
		if node != "ace" {
			return nil, false
		}
		return after.Clone(), true
	}, engine.StateServiceConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := m.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	fleetLagRead = func() { put(after, s.Next()-1) }
	t.Cleanup(func() { fleetLagRead = nil })

	put(before, checkpoint)
	out, errs, code := m.cli(t, "fleet")
	if code != 0 || !strings.Contains(rowOf(out, "ace"), "retiring") || strings.Contains(out, "the stream holds no newer event") {
		t.Errorf("fleet, ace's retirement stored and checkpointed while it read: exit %d, want ace retiring\n%s%s", code, out, errs)
	}
	put(before, checkpoint)
	out, errs, code = m.cli(t, "fleet", "-o", "json")
	var row struct {
		Seq    uint64 `json:"seq"`
		Behind bool   `json:"behind"`
	}
	if code != 0 {
		t.Fatalf("fleet -o json: exit %d\n%s%s", code, out, errs)
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &row); err != nil {
		t.Fatal(err)
	}
	if row.Seq != after.View().Seq && !row.Behind {
		t.Errorf("fleet -o json, ace's retirement stored and checkpointed while it read: its line at seq %d (the retirement's state: %d), not behind\n%s%s",
			row.Seq, after.View().Seq, out, errs)
	}
}

// TestFleetLagLineOfACheckpointJustAhead checks the table's currency
// line when a checkpoint is stamped a fraction of a second ahead of the
// reader's clock (the reconciler's host runs slightly ahead): it reads
// "checkpointed 0s ago", not "-0s ago" (fresh6 m3).
func TestFleetLagLineOfACheckpointJustAhead(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 2, 30, 0, 0, time.UTC)
	f := &fleetLag{lag: query.SnapshotLag{Partitions: []query.PartitionLag{
		{Partition: 0, Checkpoint: 10, CheckpointTime: now.Add(300 * time.Millisecond), Last: 10, LastTime: now},
		{Partition: 1, Checkpoint: 20, CheckpointTime: now.Add(-2 * time.Minute), Last: 20, LastTime: now},
	}}}
	got := f.text(now)
	want := "-- as of the reconciler's snapshots, checkpointed 0s ago (the oldest partition's 2m ago): the stream holds no newer event\n"
	if got != want {
		t.Errorf("text = %q, want %q", got, want)
	}
}

// When the events past the checkpoints cannot be read (here the stream
// is gone between the checkpoints' read and the tail's), the table says
// they could not be read and why: it counted nothing, so it names no
// count (a fresh user's finding M2: during an outage the line said
// "more than 20000 events past a partition's checkpoint" of a stream of
// 3,400).
func TestFleetLagLineWhenTheTailCannotBeRead(t *testing.T) {
	// Not parallel: it sets the package-level hook fleetLagRead.
	m := startMesh(t)
	ctx := testCtx(t)
	snapsOf(t, m) // the bucket, empty: no checkpoint yet
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	if _, err := pub.Append(ctx, "ace", events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1", RunsAs: "nobody"}}}, time.Now())); err != nil {
		t.Fatal(err)
	}
	fleetLagRead = func() {
		if err := m.js.DeleteStream(ctx, m.cfg.Name); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { fleetLagRead = nil })
	out, errs, code := m.cli(t, "fleet")
	if code != 0 || strings.Contains(out, "more than") ||
		!strings.Contains(out, "; which nodes have events past the checkpoints could not be read (") {
		t.Errorf("fleet, the tail unreadable: exit %d, want it said it could not be read, and no count\n%s%s", code, out, errs)
	}
}

// A checkpoint put while fleet waited for its reads (a reconciler
// taking partitions over, seconds into an outage) is younger than the
// command: its age is taken once the checkpoints are read, so the line
// never says "checkpointed -6s ago" (a fresh user's finding m3). Here
// the command's start is 10 s before the checkpoints are put.
func TestFleetLagLineOfACheckpointPutWhileItRead(t *testing.T) {
	// Not parallel: it sets the package-level clock fleetNow.
	m := startMesh(t)
	ctx := testCtx(t)
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	if _, err := pub.Append(ctx, "ace", events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1", RunsAs: "nobody"}}}, time.Now())); err != nil {
		t.Fatal(err)
	}
	checkpointAll(ctx, t, m)
	started := false
	fleetNow = func() time.Time {
		if !started {
			started = true
			return time.Now().Add(-10 * time.Second)
		}
		return time.Now()
	}
	t.Cleanup(func() { fleetNow = time.Now })
	out, errs, code := m.cli(t, "fleet")
	if code != 0 || !regexp.MustCompile(`(?m)^-- as of the reconciler's snapshots, checkpointed [0-9]+s ago`).MatchString(out) {
		t.Errorf("fleet, checkpointed after it started: exit %d, want \"checkpointed Ns ago\", N not negative\n%s%s", code, out, errs)
	}
}

// checkpointAll checkpoints every partition of m's stream at its last
// sequence, as a reconciler that folded every event would.
func checkpointAll(ctx context.Context, t *testing.T, m *mesh) {
	t.Helper()
	last, err := store.StreamLastSeq(ctx, mustStream(t, m))
	if err != nil {
		t.Fatal(err)
	}
	for p := range m.cfg.Partitions {
		if err := snapsOf(t, m).PutCheckpoint(ctx, p, last); err != nil {
			t.Fatal(err)
		}
	}
}
