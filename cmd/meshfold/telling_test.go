package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
	"github.com/meshfold/meshfold/store"
)

// TestFailedApplyInPlainSight: the reason of a node's newest failed
// settle is in state and under fleet's "needs an operator", shortened
// (issue 25, item 1), not only in audit and the agent's log.
func TestFailedApplyInPlainSight(t *testing.T) {
	m := startMesh(t)
	ctx := testCtx(t)
	snaps, err := store.OpenSnapshots(ctx, m.js, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := reconciletest.New(time.Now().Add(-time.Minute), time.Millisecond)
	s.Append("ace", &events.Want{Modules: []events.WantModule{{Name: "m", Build: "m:1", RunsAs: "m"}}})
	s.Append("ace", &events.Settle{Module: "m", Op: events.OpApply, Plan: 2})
	s.Append("ace", &events.Want{Modules: []events.WantModule{{Name: "web", Build: "sha256:" + strings.Repeat("0", 64), RunsAs: "web"}}})
	long := "fetch build sha256:000: not in bucket MESH_BUILDS: push it with meshfold build push" + strings.Repeat(" and more", 100)
	s.Append("ace", &events.Settle{Module: "web", Op: events.OpFailed, Plan: 5, Error: long})
	s.Append("ace", &events.Have{})
	data, _ := json.Marshal(s.State("ace"))
	if err := snaps.PutNode(ctx, events.Partition("ace", m.cfg.Partitions), "ace", data); err != nil {
		t.Fatal(err)
	}

	out, errOut, code := m.cli(t, "state", "ace", "--timeout", "100ms")
	if code != 0 {
		t.Fatalf("state: exit %d %s", code, errOut)
	}
	if !strings.Contains(out, "failed    apply of plan #5 failed for module web (#6") || !strings.Contains(out, "bucket MESH_BUILDS: push it") {
		t.Errorf("state does not say why the apply failed:\n%s", out)
	}
	if strings.Count(out, "and more") > 40 {
		t.Errorf("state quotes the error at full length:\n%s", out)
	}
	out, errOut, code = m.cli(t, "fleet", "--warnings", "0")
	if code != 0 {
		t.Fatalf("fleet: exit %d %s", code, errOut)
	}
	if !strings.Contains(out, "apply failed: web") || !strings.Contains(out, "apply-failed ace apply of plan #5 failed for module web") ||
		!strings.Contains(out, "bucket MESH_BUILDS: push it") || !strings.Contains(out, "1 need an operator") {
		t.Errorf("fleet does not say why the apply failed:\n%s", out)
	}
}
