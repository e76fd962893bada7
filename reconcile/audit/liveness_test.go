package audit_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
)

// fold folds payloads into a new state of ace, one second apart from t0.
func fold(t *testing.T, t0 time.Time, ps ...events.Payload) *reconcile.State {
	t.Helper()
	st := reconcile.NewState("ace")
	for i, p := range ps {
		at := t0.Add(time.Duration(i) * time.Second)
		events.Stamp(p, at)
		if err := p.Validate(); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		st.Fold(events.Event{Seq: uint64(i + 1), Time: at, Node: "ace", Kind: p.Kind(), Payload: p})
		if err := st.CheckInvariants(); err != nil {
			t.Fatalf("after event %d: %v", i, err)
		}
	}
	return st
}

func have(state events.RunState, restarts int, health events.Health) *events.Have {
	return &events.Have{Modules: []events.HaveModule{{Name: "web", Build: "w:1", State: state, Restarts: restarts, Health: health}}}
}

// Issue 22, item 5: fleet lists an agent down, an unhealthy module and a
// module that flaps (crashes after running, three times in ten minutes)
// as needing an operator; a module that crash-looped without ever running
// and then runs has recovered; state says since when a module is healthy.
func TestFleetLiveness(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	row := func(st *reconcile.State, at time.Time) audit.FleetRow {
		return audit.FleetRowOf(st, at, 10*time.Minute)
	}
	down := fold(t, t0, have(events.Running, 0, ""),
		&events.Agent{State: events.AgentDown, Claim: "c1", Host: "h", PID: 7, Why: events.WhyExpired})
	if r := row(down, t0.Add(2*time.Second)); r.Agent != "down" || !slices.Equal(r.Attention, []string{"agent-down"}) {
		t.Errorf("agent down: agent %q, attention %v", r.Agent, r.Attention)
	}
	up := fold(t, t0, have(events.Running, 0, ""),
		&events.Agent{State: events.AgentDown, Claim: "c1", Why: events.WhyExpired}, have(events.Running, 0, ""))
	if r := row(up, t0.Add(3*time.Second)); r.Agent != "up" || len(r.Attention) != 0 {
		t.Errorf("a have after the down: agent %q, attention %v; want up, nothing", r.Agent, r.Attention)
	}

	flap := fold(t, t0, have(events.Running, 0, ""), have(events.Failed, 1, ""), have(events.Running, 1, ""),
		have(events.Running, 2, ""), have(events.Running, 3, ""))
	if r := row(flap, t0.Add(5*time.Second)); !slices.Equal(r.Attention, []string{"flapping"}) || len(r.Flapping) != 1 {
		t.Errorf("three crashes after running: attention %v", r.Attention)
	} else if line := r.Line(4); !strings.Contains(line, "web flapping ×3") {
		t.Errorf("fleet line %q", line)
	}
	// state says what fleet flags it for (a fresh user's finding F2: the
	// two views disagreed).
	if text := audit.StateText(flap.View(), reconcile.CompositionOf(flap), t0.Add(5*time.Second), "test"); !strings.Contains(strings.Join(strings.Fields(text), " "),
		"flapping: 3 crashes after running since 2026-12-01T20:00:01.000Z (4s ago)") {
		t.Errorf("state does not say web flaps:\n%s", text)
	}
	if r := audit.FleetRowOf(flap, t0.Add(11*time.Minute), time.Hour); len(r.Attention) != 0 {
		t.Errorf("flapping ten minutes later: attention %v", r.Attention)
	}
	recovered := fold(t, t0, have(events.Running, 0, ""), have(events.Failed, 1, ""), have(events.Failed, 4, ""),
		have(events.Running, 5, ""))
	if r := row(recovered, t0.Add(5*time.Second)); len(r.Attention) != 0 {
		t.Errorf("a crash loop that never ran, then runs: attention %v", r.Attention)
	}

	sick := fold(t, t0, have(events.Running, 0, events.HealthStarting), have(events.Running, 0, events.Healthy),
		have(events.Running, 0, events.Healthy), have(events.Running, 0, events.Unhealthy))
	r := row(sick, t0.Add(4*time.Second))
	if !slices.Equal(r.Attention, []string{"unhealthy"}) || !strings.Contains(r.Line(4), "web unhealthy") {
		t.Errorf("unhealthy: attention %v, line %q", r.Attention, r.Line(4))
	}
	healthy := fold(t, t0, have(events.Running, 0, events.HealthStarting), have(events.Running, 0, events.Healthy),
		have(events.Running, 0, events.Healthy))
	text := audit.StateText(healthy.View(), reconcile.CompositionOf(healthy), t0.Add(10*time.Second), "test")
	if !strings.Contains(text, "healthy (since 2026-12-01T20:00:01.000Z, 9s ago)") {
		t.Errorf("state does not say since when web is healthy:\n%s", text)
	}
}

// Issue 26: a module whose on_fill action is a restart is restarted once
// per rotated credential. Those restarts are counted apart
// (fill_restarts), so three rotations in ten minutes do not make it a
// flapping module; state and the timeline still tell them.
func TestFillRestartsAreNotCrashes(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	refilled := func(n int) *events.Have {
		return &events.Have{Modules: []events.HaveModule{{Name: "web", Build: "w:1", State: events.Running, FillRestarts: n}}}
	}
	evs := []events.Payload{refilled(0), refilled(1), refilled(2), refilled(3), refilled(4)}
	st := fold(t, t0, evs...)
	if r := audit.FleetRowOf(st, t0.Add(5*time.Second), 10*time.Minute); len(r.Attention) != 0 || len(r.Flapping) != 0 {
		t.Errorf("four on_fill restarts: attention %v, flapping %v; want nothing", r.Attention, r.Flapping)
	}
	text := audit.StateText(st.View(), reconcile.CompositionOf(st), t0.Add(5*time.Second), "test")
	if !strings.Contains(text, "0 restarts, 4 on_fill restarts") {
		t.Errorf("state does not tell the on_fill restarts:\n%s", text)
	}
	var es []events.Event
	for i, p := range evs {
		es = append(es, events.Event{Seq: uint64(i + 1), Time: t0.Add(time.Duration(i) * time.Second), Node: "ace", Kind: p.Kind(), Payload: p})
	}
	h, err := audit.NewHistory("ace", es)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.Timeline(0, len(es))[4].Summary; got != "web running, on_fill restarts 3→4" {
		t.Errorf("timeline: %q", got)
	}
}

// A fresh user's finding F2: a module that crashed three times at one
// build and then runs another (auto_revert put the old one back, a new
// rollout gave a third) is not flapping: the crashes were the old
// build's. fleet flagged it "app flapping ×0" at the top of what needs an
// operator, with the old build's crash times under the new build, while
// state said it ran.
func TestFlappingBelongsToTheBuildThatCrashed(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	at := func(build string, state events.RunState, restarts int) *events.Have {
		return &events.Have{Modules: []events.HaveModule{{Name: "app", Build: build, State: state, Restarts: restarts}}}
	}
	late := []events.Payload{at("v:1", events.Running, 0), at("late:1", events.Running, 0), at("late:1", events.Failed, 1),
		at("late:1", events.Running, 1), at("late:1", events.Running, 2), at("late:1", events.Running, 3)}
	if r := audit.FleetRowOf(fold(t, t0, late...), t0.Add(6*time.Second), time.Hour); len(r.Flapping) != 1 {
		t.Fatalf("late:1 crashed three times after running: flapping %v, attention %v", r.Flapping, r.Attention)
	}
	for _, next := range []string{"v:1", "v:2"} {
		st := fold(t, t0, append(slices.Clone(late), at(next, events.Running, 0))...)
		r := audit.FleetRowOf(st, t0.Add(7*time.Second), time.Hour)
		if len(r.Attention) != 0 || len(r.Flapping) != 0 {
			t.Errorf("%s runs after late:1's crashes: attention %v, flapping %v, line %q; want nothing", next, r.Attention, r.Flapping, r.Line(4))
		}
		if rt := reconcile.RuntimeOf(st); len(rt) != 1 || len(rt[0].Crashes) != 0 {
			t.Errorf("%s runs after late:1's crashes: runtime %+v; want no crash", next, rt)
		}
	}
}
