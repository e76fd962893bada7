package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/console"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/rollout"
)

// oneRollout is a fake whose stream holds one fleet's rollout, s.
type oneRollout struct {
	*fake
	s *rollout.State
}

func (o oneRollout) RolloutFleets(context.Context) ([]string, error) { return []string{o.s.Fleet}, nil }
func (o oneRollout) Rollout(context.Context, string) (*rollout.State, error) {
	return o.s, nil
}

// leasedRollout is oneRollout whose fleet's controller lease was last
// renewed at renewed, with a TTL of ttl.
type leasedRollout struct {
	oneRollout
	renewed time.Time
	ttl     time.Duration
}

func (l leasedRollout) ControllerHolder(_ context.Context, fleet string) (query.LeaseHolder, time.Duration, error) {
	return query.LeaseHolder{Key: "rollout." + fleet, Held: true, Who: "reconciler r1", Renewed: l.renewed}, l.ttl, nil
}

// revertStalled folds a rollout of ace and bob (max_unavailable 1): ace
// done, bob given its new want, then its agent down, then a revert: bob
// is given back at once (unavailable already), ace waits for the budget
// bob spends while down, and no revert step is under way.
func revertStalled(t *testing.T) *rollout.State {
	t.Helper()
	cands := []rollout.Candidate{
		{Node: "ace", Prev: 1, Want: []events.WantModule{{Name: "web", Build: "b2"}}, Current: []events.WantModule{{Name: "web", Build: "b1"}}},
		{Node: "bob", Prev: 2, Want: []events.WantModule{{Name: "web", Build: "b2"}}, Current: []events.WantModule{{Name: "web", Build: "b1"}}},
	}
	zero := rollout.Duration(0)
	start, _ := rollout.NewStart("alice", "", rollout.Params{Batch: rollout.Amount{N: 2}, MinHealthy: &zero}, cands)
	s := rollout.NewState("web")
	seq := uint64(2)
	t0 := time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC)
	fold := func(in rollout.Input) {
		t.Helper()
		seq++
		in.Seq, in.Time = seq, t0.Add(time.Duration(seq)*time.Second)
		s.Fold(in)
		if err := s.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
	}
	published := func(node string, step rollout.Step) uint64 {
		fold(rollout.Input{Node: node, Kind: rollout.KindWant})
		fold(rollout.Input{Kind: rollout.KindPublished, Payload: &rollout.Published{Rollout: 3, Node: node, Step: step, Want: seq}})
		return seq - 1
	}
	fold(rollout.Input{Kind: rollout.KindStart, Payload: start})
	want := published("ace", rollout.StepForward)
	fold(rollout.Input{Node: "ace", Kind: rollout.KindPlan, Payload: &events.Plan{Cause: want, Want: want, Modules: []events.PlanModule{{Name: "web", Build: "b2"}}}})
	fold(rollout.Input{Node: "ace", Kind: rollout.KindSettle, Payload: &events.Settle{Op: events.OpApply, Plan: seq}})
	fold(rollout.Input{Node: "ace", Kind: rollout.KindHave, Payload: &rollout.Have{Modules: []rollout.HaveModule{{Name: "web", Build: "b2", State: events.Running}}}})
	published("bob", rollout.StepForward)
	fold(rollout.Input{Node: "bob", Kind: rollout.KindDown})
	fold(rollout.Input{Kind: rollout.KindRevert, Payload: rollout.NewOperator(rollout.KindRevert, 0, "alice", "")})
	published("bob", rollout.StepRevert)
	if b := s.Rollout.Nodes["ace"].Back; b == nil || b.Status != rollout.RevertQueued {
		t.Fatalf("ace's revert %+v, want queued", b)
	}
	return s
}

// The rollout page says a revert waits for the budget and who spends it:
// the stalled line, and the waiting target's WHY and status.
func TestRolloutPageRevertWaits(t *testing.T) {
	t.Parallel()
	f := newFake()
	healthy(f, "ace")
	c, err := console.New(console.Config{Source: oneRollout{f, revertStalled(t)}, Now: time.Now})
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
	if code != http.StatusOK {
		t.Fatalf("/rollouts/web: %d\n%s", code, body)
	}
	for _, want := range []string{
		`<p class="error stalled">stalled: 1 target of the revert waits for the budget: 1 of max_unavailable 1 unavailable: bob (agent down); no revert step is under way`,
		`done; revert queued`,
		`<td>its previous want waits for the budget: 1 of max_unavailable 1 unavailable: bob (agent down)</td>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the rollout page lacks %q:\n%s", want, body)
		}
	}
}

// The rollout page counts the targets of each status at the top, each a
// link to those targets only (a fresh user's finding M7: 300 rows, no
// count); the rollouts list says a rollout no controller acts on has
// none, as `rollout ls` does (finding M9: the list said "running" where
// ls said "running, no controller for 1m22s").
func TestRolloutPagesCountAndUnattended(t *testing.T) {
	t.Parallel()
	f := newFake()
	healthy(f, "ace")
	// A rollout of ace and bob, started and never recorded by a
	// controller: both steps decided, neither published.
	cands := []rollout.Candidate{
		{Node: "ace", Prev: 1, Want: []events.WantModule{{Name: "web", Build: "b2"}}, Current: []events.WantModule{{Name: "web", Build: "b1"}}},
		{Node: "bob", Prev: 2, Want: []events.WantModule{{Name: "web", Build: "b2"}}, Current: []events.WantModule{{Name: "web", Build: "b1"}}},
		{Node: "cat", Prev: 2, Want: []events.WantModule{{Name: "web", Build: "b2"}}, Current: []events.WantModule{{Name: "web", Build: "b1"}}},
	}
	start, _ := rollout.NewStart("alice", "", rollout.Params{Batch: rollout.Amount{N: 2}}, cands)
	s := rollout.NewState("web")
	t0 := time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC)
	s.Fold(rollout.Input{Seq: 3, Time: t0, Kind: rollout.KindStart, Payload: start})
	now := t0.Add(82 * time.Second)
	c, err := console.New(console.Config{Source: oneRollout{f, s}, Now: func() time.Time { return now }})
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
	u := s.Unattended(now)
	if u == nil {
		t.Fatal("the fixture's rollout is attended: the test needs one no controller acts on")
	}
	code, body := fx.get(t, "/rollouts")
	if code != http.StatusOK || !strings.Contains(body, `<td class="phase">running, no controller for 1m22s</td>`) {
		t.Errorf("/rollouts: %d, lacks \"running, no controller for 1m22s\":\n%s", code, body)
	}
	if !strings.Contains(body, `<p class="error unattended">unattended: no rollout controller acts on fleet web&#39;s rollout`) {
		t.Errorf("/rollouts lacks the unattended line:\n%s", body)
	}
	code, body = fx.get(t, "/rollouts/web")
	if code != http.StatusOK || !strings.Contains(body, `<p id="counts">3 targets: <a class="count" data-status="publishing" href="?status=publishing">1 publishing</a>, <a class="count" data-status="pending" href="?status=pending">2 pending</a></p>`) ||
		!strings.Contains(body, `id="target-ace"`) || !strings.Contains(body, `id="target-cat"`) {
		t.Errorf("/rollouts/web: %d, lacks the counts or a target:\n%s", code, body)
	}
	_, body = fx.get(t, "/rollouts/web?status=publishing")
	if !strings.Contains(body, `id="target-ace"`) || strings.Contains(body, `id="target-bob"`) || strings.Contains(body, `id="target-cat"`) ||
		!strings.Contains(body, "showing the 1 publishing only") {
		t.Errorf("/rollouts/web?status=publishing: not ace alone:\n%s", body)
	}
	if code, body := fx.get(t, "/rollouts/web?status=broken"); code != http.StatusBadRequest {
		t.Errorf("/rollouts/web?status=broken: %d, want 400\n%s", code, body)
	}
}

// The rollouts list measures "no controller for" from the controller
// lease's expiry when the source reads the lease: a rollout quiet since
// its start, whose controller renewed its lease 40 s after it and then
// died, has had no controller for 27 s at 82 s (40 s + a 15 s TTL), not
// 1m22s (a fresh user's finding M8: "no controller for 5m37s" 82 s
// after the kill -9 of the last reconciler).
func TestRolloutsListCountsNoControllerFromTheLease(t *testing.T) {
	t.Parallel()
	f := newFake()
	healthy(f, "ace")
	cands := []rollout.Candidate{
		{Node: "ace", Prev: 1, Want: []events.WantModule{{Name: "web", Build: "b2"}}, Current: []events.WantModule{{Name: "web", Build: "b1"}}},
		{Node: "bob", Prev: 2, Want: []events.WantModule{{Name: "web", Build: "b2"}}, Current: []events.WantModule{{Name: "web", Build: "b1"}}},
	}
	start, _ := rollout.NewStart("alice", "", rollout.Params{Batch: rollout.Amount{N: 2}}, cands)
	s := rollout.NewState("web")
	t0 := time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC)
	s.Fold(rollout.Input{Seq: 3, Time: t0, Kind: rollout.KindStart, Payload: start})
	now := t0.Add(82 * time.Second)
	if s.Unattended(now) == nil {
		t.Fatal("the fixture's rollout is attended: the test needs one no controller acts on")
	}
	src := leasedRollout{oneRollout{f, s}, t0.Add(40 * time.Second), 15 * time.Second}
	fx := startWith(t, f, console.Config{Source: src, Now: func() time.Time { return now }})
	code, body := fx.get(t, "/rollouts")
	if code != http.StatusOK || !strings.Contains(body, `<td class="phase">running, no controller for 27s</td>`) {
		t.Errorf("/rollouts: %d, lacks \"running, no controller for 27s\":\n%s", code, body)
	}
}
