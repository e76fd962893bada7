package main

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
)

// emptyRun empties the node's /run (its root's run directory), as a
// reboot with a tmpfs /run or a re-image does.
func (r *refillMesh) emptyRun(t testing.TB) {
	t.Helper()
	if err := os.RemoveAll(filepath.Join(r.s.root, "run")); err != nil {
		t.Fatal(err)
	}
}

// knocksSince returns the knocks after r.last, up to a poke's: the
// reconciler publishes a node's effects in the order it folds their
// causes, so once the poke's knock is stored every knock of the events
// before it is. It returns once the provisioner's pass for the poke is
// done (a pass under way when the agent is killed waits out its fill
// request's timeout, 5 s, before the next knock's).
func (r *refillMesh) knocksSince(t *testing.T) []events.Event {
	t.Helper()
	if _, errs, code := r.s.m.cli(t, "poke", "ace", "--by", "test"); code != 0 {
		t.Fatalf("poke: %d %s", code, errs)
	}
	var poke uint64
	waitKind(t, r.s.m, events.KindKnock, func(ev events.Event) bool {
		poke = ev.Seq
		return ev.Seq > r.last && slices.Equal(ev.Payload.(*events.Knock).Reasons, []events.KnockReason{events.KnockOperator})
	})
	done := " knock=" + strconv.FormatUint(poke, 10) + " "
	waitfor.Until(t, time.Minute, "the provisioner's pass for the poke", func() bool {
		for _, l := range strings.Split(r.s.provErr.String(), "\n") {
			if strings.Contains(l, `msg="fill pass done"`) && strings.Contains(l, done) {
				return true
			}
		}
		return false
	})
	var out []events.Event
	for _, ev := range readEvents(t, r.s.m, "ace", events.KindKnock) {
		if ev.Seq > r.last && ev.Seq < poke {
			out = append(out, ev)
		}
	}
	return out
}

// TestAgentStartToFileBack measures the time from the agent's start
// (killed -9, /run emptied, the provisioner running) to the file back on
// the node, MESHFOLD_STARTGONE_RUNS times (unset: skipped), with one knock
// a start; it asserts no time.
//
//	MESHFOLD_STARTGONE_RUNS=5 go test ./cmd/meshfold -run AgentStartToFileBack -v
func TestAgentStartToFileBack(t *testing.T) {
	// Not parallel: a measure.
	runs, _ := strconv.Atoi(os.Getenv("MESHFOLD_STARTGONE_RUNS"))
	if runs <= 0 || testing.Short() {
		t.Skip("a measure: set MESHFOLD_STARTGONE_RUNS")
	}
	r := startRefillMesh(t)
	s := r.s
	var took []time.Duration
	for range runs {
		kill9(t, s.agent)
		r.emptyRun(t)
		r.last = lastSeq(t, s)
		began := time.Now()
		s.agentStart()
		r.waitBack(t, "the credential filled again after the agent's start")
		took = append(took, time.Since(began))
		if knocks := r.knocksSince(t); len(knocks) != 1 {
			t.Errorf("%d knocks for the agent's start, want exactly 1: %v", len(knocks), knocks)
		}
	}
	t.Logf("agent start → file back, %d runs: %v", runs, took)
	slices.Sort(took)
	t.Logf("p50 %s, max %s", took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
}
