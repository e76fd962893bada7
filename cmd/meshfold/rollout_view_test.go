package main

import (
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/rollout"
)

// rollout status names a node's pause in STATUS and WHY, and keeps a
// reverted target's forward plan and settle in PLAN and SETTLED.
func TestRolloutStatusPausedAndReverted(t *testing.T) {
	at := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	v := rollout.View{Fleet: "web", Rollout: 4, Phase: rollout.Reverted, Batch: 1, Batches: 2, Targets: []rollout.TargetView{
		{Node: "bob", Batch: 1, Status: rollout.Done, Published: 6, Plan: 8, Settled: true, SettledAt: at,
			Revert: &rollout.Back{Status: rollout.RevertDone}},
		{Node: "eve", Batch: 1, Status: rollout.Unreached, Published: 9, Paused: &rollout.Mark{By: "you", Time: at, Reason: "disk swap"},
			Why: "paused by you since 2026-12-01T20:00:00Z: disk swap"},
		{Node: "fay", Batch: 2, Status: rollout.Skipped, Why: "the rollout is reverted: it never got its new want"},
	}}
	var b strings.Builder
	if err := writeRolloutView(&b, v); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"#6", "#8", "yes", "unreached, paused", "paused by you since 2026-12-01T20:00:00Z: disk swap", "fay", "skipped", "never got its new want"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "bob ") && (!strings.Contains(l, "#8") || !strings.Contains(l, "yes")) {
			t.Errorf("bob's line lacks its plan #8 settled: %q", l)
		}
	}
}
