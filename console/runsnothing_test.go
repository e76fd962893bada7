package console_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/console"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
)

// canaryRunningNothing folds a rollout of fleet web whose new want has no
// module up to its canary ace done, waiting for the promote.
func canaryRunningNothing(t *testing.T) *rollout.State {
	t.Helper()
	var cands []rollout.Candidate
	for i, n := range []string{"ace", "bob", "cat"} {
		cands = append(cands, rollout.Candidate{Node: n, Want: []events.WantModule{}, Prev: uint64(i + 1),
			Current: []events.WantModule{{Name: "web", Build: "b1"}}})
	}
	start, _ := rollout.NewStart("alice", "", rollout.Params{Canary: rollout.Amount{N: 1}, MinHealthy: rollout.Duration(0).Ptr()}, cands)
	s := rollout.NewState("web")
	seq := uint64(3)
	var queue []rollout.Input
	add := func(in rollout.Input) uint64 {
		seq++
		in.Seq, in.Time = seq, time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC).Add(time.Duration(seq)*time.Second)
		queue = append(queue, in)
		return seq
	}
	add(rollout.Input{Kind: rollout.KindStart, Payload: start})
	for len(queue) > 0 {
		in := queue[0]
		queue = queue[1:]
		for _, e := range s.Fold(in) {
			if e.Record != nil {
				add(rollout.Input{Kind: rollout.KindRecord, Payload: e.Record})
				continue
			}
			w := e.Want
			want := add(rollout.Input{Node: w.Node, Kind: rollout.KindWant})
			add(rollout.Input{Kind: rollout.KindPublished, Payload: &rollout.Published{Rollout: w.Rollout, Node: w.Node, Step: w.Step, Want: want}})
			plan := add(rollout.Input{Node: w.Node, Kind: rollout.KindPlan, Payload: &events.Plan{Cause: want, Want: want}})
			add(rollout.Input{Node: w.Node, Kind: rollout.KindSettle, Payload: &events.Settle{Op: events.OpApply, Plan: plan}})
			add(rollout.Input{Node: w.Node, Kind: rollout.KindHave, Payload: &rollout.Have{}})
		}
	}
	if s.Rollout == nil || s.Rollout.Phase != rollout.WaitingPromote {
		t.Fatalf("the fold did not reach waiting-promote: %+v", s.View())
	}
	return s
}

// The fleet's rollout page says a done canary whose new want has no
// module runs nothing now, and what a promote would do (a fresh user's
// finding U13: "done", RUNNING empty, and nothing else).
func TestRolloutPageRunsNothing(t *testing.T) {
	t.Parallel()
	f := newFake()
	c, err := console.New(console.Config{Source: oneRollout{f, canaryRunningNothing(t)}, Now: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	fx := &fixture{f: f, srv: httptest.NewServer(c)}
	t.Cleanup(func() {
		fx.srv.Close()
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	code, body := fx.get(t, "/rollouts/web")
	if code != 200 {
		t.Fatalf("GET /rollouts/web: %d\n%s", code, body)
	}
	for _, want := range []string{
		`<p class="error promote-note">before a promote: canary ace runs nothing now: its new want has no module, so it was done with nothing to judge; a promote gives 2 more targets a want of no module</p>`,
		`<td>done, runs nothing now</td>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the rollout page lacks %s:\n%s", want, body)
		}
	}
}
