package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
)

// With every reconciler killed (kill -9 of the only one), `fleet` says
// first that no reconciler answers, folds the nodes whose events are past
// their snapshots here, and blames none of them for a stale have their
// events hold; `state` folds the node's events past its snapshot too, as
// fleet's line says (a fresh user's finding M9: fleet counted a growing
// number of nodes "stale-have" from snapshots it knew lagged, advised
// 'meshfold state NODE' "folds one from the stream", and state answered
// from the same stale snapshot).
func TestFleetAndStateWithEveryReconcilerKilled(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts and kills a reconciler process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	m := startMesh(t)
	dir := t.TempDir()
	proc := startMeshfold(t, "reconcile", "--server", m.e.ClientURL(), "--signing-key", filepath.Join(dir, signingKeyFile),
		"--snapshot-interval", "100ms", "--log-level", "warn")
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	w, err := pub.Append(ctx, "ace", events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1", RunsAs: "nobody"}}}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	// The reconciler folds the want, plans, and stores ace's state (no
	// have yet) under a checkpoint past it.
	snaps := snapsOf(t, m)
	p := events.Partition("ace", m.cfg.Partitions)
	waitfor.Until(t, time.Minute, "ace's state stored and checkpointed past its want", func() bool {
		b, _, err := snaps.GetNode(ctx, "ace")
		if err != nil {
			return false
		}
		st, err := reconcile.UnmarshalState(b)
		if err != nil || st.Want == nil || st.Want.Seq != w.Seq || st.NewestPlan == 0 {
			return false
		}
		ck, err := snaps.Checkpoint(ctx, p)
		return err == nil && ck >= st.Seq
	})
	if err := proc.cmd.Process.Signal(syscall.SIGKILL); err != nil { // by pid: the process this test started
		t.Fatal(err)
	}
	select {
	case <-proc.done:
	case <-ctx.Done():
		t.Fatalf("reconciler pid %d did not exit on SIGKILL", proc.cmd.Process.Pid)
	}
	// The agent reports what runs: its have is in the stream, and no
	// reconciler folds it.
	h, err := pub.Append(ctx, "ace", events.Stamp(&events.Have{Modules: []events.HaveModule{}}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}

	out, errs, code := m.cli(t, "fleet", "--timeout", "5s")
	if code != 0 {
		t.Fatalf("fleet: exit %d\n%s%s", code, out, errs)
	}
	t.Logf("fleet with no reconciler:\n%s", out)
	if !strings.HasPrefix(out, "-- NO RECONCILER ANSWERS for the nodes of partition ") || !strings.Contains(firstLineOf(out), " are folded by none") {
		t.Errorf("fleet with no reconciler: the first line does not say that none answers\n%s", out)
	}
	if !strings.Contains(out, "-- 1 node, 1 needs an operator, and no reconciler answers (the first line)\n") {
		t.Errorf("fleet with no reconciler: the count line does not say that none answers\n%s", out)
	}
	if row := rowOf(out, "ace"); row == "" || strings.Contains(row, "stale-have") {
		t.Errorf("fleet with no reconciler: ace's row %q blames a stale have, its have #%d in the stream\n%s", row, h.Seq, out)
	}
	if !strings.Contains(out, "1 node with events past them folded here from the stream, no reconciler answering (ace)") ||
		strings.Contains(out, "folds one from the stream") || strings.Contains(out, "in every row already") {
		t.Errorf("fleet with no reconciler: the lag line does not say ace was folded here\n%s", out)
	}

	out, errs, code = m.cli(t, "state", "ace", "--timeout", "100ms")
	if code != 0 || !strings.Contains(strings.Join(strings.Fields(out), " "), "the stored snapshot and the node's events past it, read from the stream: no reconciler answered") {
		t.Errorf("state with no reconciler: exit %d, want the snapshot and the events past it\n%s%s", code, out, errs)
	}
	out, errs, code = m.cli(t, "state", "ace", "--timeout", "100ms", "-o", "json")
	var r stateReply
	if code != 0 || json.Unmarshal([]byte(out), &r) != nil {
		t.Fatalf("state -o json: exit %d\n%s%s", code, out, errs)
	}
	if r.Source != "snapshot+stream" || r.View.HaveSeq != h.Seq || r.View.Seq < h.Seq {
		t.Errorf("state -o json with no reconciler: source %q, have #%d, seq %d; want snapshot+stream, have #%d\n%s", r.Source, r.View.HaveSeq, r.View.Seq, h.Seq, out)
	}
}

// firstLineOf returns s's first line.
func firstLineOf(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
