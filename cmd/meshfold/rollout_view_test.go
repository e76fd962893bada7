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
	t.Parallel()
	at := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	v := rollout.View{Fleet: "web", Rollout: 4, Phase: rollout.Reverted, Batch: 1, Batches: 2, Targets: []rollout.TargetView{
		{Node: "bob", Batch: 1, Status: rollout.Done, Published: 6, Plan: 8, Settled: true, SettledAt: at,
			Revert: &rollout.Back{Status: rollout.RevertDone}},
		{Node: "eve", Batch: 1, Status: rollout.Unreached, Published: 9, Paused: &rollout.Mark{By: "you", Time: at, Reason: "disk swap"},
			Why: "paused by you since 2026-12-01T20:00:00Z: disk swap"},
		{Node: "fay", Batch: 2, Status: rollout.Skipped, Why: "the rollout is reverted: it never got its new want"},
	}}
	var b strings.Builder
	if err := writeRolloutView(&b, v, time.Now(), defaultTargetPaging); err != nil {
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

// rollout status prints a target's why whole, as the rollout's fold
// worded it: neither quoted again nor cut in the middle of a word (the
// fold already cut a long apply error, keeping its head and tail), and
// -o json keeps its "<", ">" and "&" as they are.
func TestRolloutStatusWhyWhole(t *testing.T) {
	t.Parallel()
	why := `apply of plan 8 failed for module "web": bundle sha256:0123456789ab…: exec "/srv/web/run" <no such file> & its health check "http://127.0.0.1:8080/healthz" never answered within the healthy_deadline of 1m0s`
	if len(why) <= 200 {
		t.Fatalf("the why is %d bytes: it must be longer than events.ErrorText keeps", len(why))
	}
	v := rollout.View{Fleet: "web", Rollout: 2, Phase: rollout.Halted, Targets: []rollout.TargetView{
		{Node: "bob", Batch: 1, Status: rollout.Failed, Why: why}}}
	var b strings.Builder
	if err := writeRolloutView(&b, v, time.Now(), defaultTargetPaging); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), why) {
		t.Errorf("status does not print the why whole:\n%s", b.String())
	}
	b.Reset()
	if err := writeValue(&b, outJSON, v); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), `\u003c`) || strings.Contains(b.String(), `\u0026`) || !strings.Contains(b.String(), "<no such file> & its") {
		t.Errorf("-o json escapes the why as HTML:\n%s", b.String())
	}
}

// rollout status prints a waiting line whole and unquoted (a fresh
// user's finding: it was quoted and cut at 201 bytes). (That a target
// whose agent is down says so in WHY, canary or not, is the rollout's
// view: rollout/testdata/unreached.txt.)
func TestRolloutStatusWaitingWhole(t *testing.T) {
	t.Parallel()
	waiting := "canary ivy: agent down since 2026-12-01T20:00:11Z; paused by alice since 2026-12-01T20:00:12Z: disk swap: the canary batch waits for it; the rollout halts at its healthy_deadline 2026-12-01T20:05:04Z unless it is back and runs the new build healthy by then"
	if len(waiting) <= 201 {
		t.Fatalf("the line is %d bytes: it must be longer than events.ErrorText keeps", len(waiting))
	}
	v := rollout.View{Fleet: "web", Rollout: 4, Phase: rollout.Running, Batch: 1, Batches: 2, Waiting: []string{waiting}, Targets: []rollout.TargetView{
		{Node: "ivy", Batch: 1, Status: rollout.Changing, Published: 6, Down: true, Why: waiting},
	}}
	var b strings.Builder
	if err := writeRolloutView(&b, v, time.Now(), defaultTargetPaging); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "waiting: "+waiting+"\n") {
		t.Errorf("status does not print the waiting line whole and unquoted:\n%s", b.String())
	}
}

// rollout status says in one line that a rollout is stalled by its
// budget and why (a fresh user's finding: only 'rollout why' said it).
func TestRolloutStatusStalled(t *testing.T) {
	t.Parallel()
	stalled := "2 targets of batch 2 wait for the budget: 1 of max_unavailable 1 unavailable: dan (agent down); no step of the rollout is under way: it moves on when one of them is available again (or abort, or apply again with a larger max_unavailable)"
	v := rollout.View{Fleet: "web", Rollout: 4, Phase: rollout.Running, Batch: 2, Batches: 3, Stalled: stalled, Targets: []rollout.TargetView{
		{Node: "cat", Batch: 2, Status: rollout.Pending},
		{Node: "dan", Batch: 2, Status: rollout.Pending, Down: true},
	}}
	var b strings.Builder
	if err := writeRolloutView(&b, v, time.Now(), defaultTargetPaging); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "\nstalled: "+stalled+"\n") {
		t.Errorf("status does not say it is stalled, in one line:\n%s", b.String())
	}
}

// rollout status shows a promote and says that a paused rollout gives no
// target its new want until resumed (a fresh user's finding: a promote
// while paused was taken silently).
func TestRolloutStatusPromotedWhilePaused(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	v := rollout.View{Fleet: "web", Rollout: 4, Phase: rollout.Running, Batch: 2, Batches: 2, Promoted: true,
		Promote: &rollout.Mark{Seq: 9, Time: at, By: "bob"}, Paused: &rollout.Mark{Seq: 8, Time: at, By: "alice", Reason: "migration"},
		Targets: []rollout.TargetView{{Node: "bob", Batch: 2, Status: rollout.Pending}}}
	var b strings.Builder
	if err := writeRolloutView(&b, v, time.Now(), defaultTargetPaging); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"promoted at #9 2026-12-01T20:00:00Z by bob\n",
		"paused at #8 2026-12-01T20:00:00Z by alice: migration; no target gets its new want until 'meshfold rollout resume web'\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
}

// A canary whose new want has no module is done with nothing to judge:
// status says "done, runs nothing now", its why, and before the promote
// how many more targets a promote empties (a fresh user's finding U13:
// it showed plain "done").
func TestRolloutStatusRunsNothing(t *testing.T) {
	t.Parallel()
	note := "canary ace runs nothing now: its new want has no module, so it was done with nothing to judge; a promote gives 2 more targets a want of no module"
	v := rollout.View{Fleet: "web", Rollout: 4, Phase: rollout.WaitingPromote, Batch: 1, Batches: 2, PromoteNote: note, Targets: []rollout.TargetView{
		{Node: "ace", Batch: 1, Status: rollout.Done, Published: 6, RunsNothing: true, Why: "runs nothing now: its new want #6 has no module, so every module it ran was removed"},
		{Node: "bob", Batch: 2, Status: rollout.Pending, RunsNothing: true},
	}}
	var b strings.Builder
	if err := writeRolloutView(&b, v, time.Now(), defaultTargetPaging); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "before a promote: "+note+"\n") {
		t.Errorf("status lacks the promote note:\n%s", out)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "ace ") && (!strings.Contains(l, "done, runs nothing now") || !strings.Contains(l, "every module it ran was removed")) {
			t.Errorf("ace's line does not say it runs nothing now: %q", l)
		}
		if strings.HasPrefix(l, "bob ") && strings.Contains(l, "runs nothing") {
			t.Errorf("bob, pending, is said to run nothing now: %q", l)
		}
	}
}

// rollout status's budget line counts what a forward step's budget
// counts, and says which targets unhealthy already it does not (they
// take their want in their batch's turn whatever the budget; a fresh
// user's finding G1 of fresh7 read "4 of max_unavailable 3" while the
// canary stalled).
func TestRolloutStatusBudgetNotCounted(t *testing.T) {
	t.Parallel()
	v := rollout.View{Fleet: "web", Rollout: 4, Phase: rollout.Running, Batch: 1, Batches: 5, Nodes: 20,
		Unavailable: 6, AwaitTurn: 4, Params: rollout.ViewParams{MaxUnavailable: 3, Canary: 2, Batch: 5}}
	var b strings.Builder
	if err := writeRolloutView(&b, v, time.Now(), defaultTargetPaging); err != nil {
		t.Fatal(err)
	}
	want := "budget: 2 of max_unavailable 3 unavailable (20 nodes; not counted: 4 targets unhealthy already, 6 unavailable in all, that take their want in their batch's turn whatever the budget); canary 2, batch 5"
	if !strings.Contains(b.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, b.String())
	}
}
