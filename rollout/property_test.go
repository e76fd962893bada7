package rollout_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
)

// history drives a harness with a random rollout: a fleet of 2 to 7
// nodes, some targets, random parameters, then random node behaviour
// (plans that settle or fail, haves healthy, unhealthy, crash-looping,
// agents going down and up, wants by hand), time passing and operator
// verbs, with the controller now and then stalled and restarted.
func history(t *rapid.T) *harness {
	h := newHarness("web")
	h.quiet = true
	count := rapid.IntRange(2, 7).Draw(t, "nodes")
	var names []string
	for i := range count {
		name := fmt.Sprintf("n%d", i)
		names = append(names, name)
		h.addWant(t, name, []events.WantModule{{Name: "web", Build: "b1"}}, "")
	}
	p := &rollout.Start{By: "ops", Pages: 1, Wants: [][]events.WantModule{{{Name: "web", Build: "b2"}}, {{Name: "web", Build: "b2"}, {Name: "db", Build: "d1", RequiresApproval: true}}}}
	p.Params = rollout.Params{
		Batch:           rollout.Amount{N: rapid.IntRange(1, 3).Draw(t, "batch")},
		MaxUnavailable:  rollout.Amount{N: rapid.IntRange(1, 3).Draw(t, "max_unavailable")},
		Canary:          rollout.Amount{N: rapid.IntRange(0, 2).Draw(t, "canary")},
		MinHealthy:      rollout.Duration(time.Duration(rapid.IntRange(0, 20).Draw(t, "min_healthy")) * time.Second).Ptr(),
		HealthyDeadline: rollout.Duration(time.Duration(rapid.IntRange(30, 300).Draw(t, "healthy_deadline")) * time.Second),
		AutoRevert:      rapid.Bool().Draw(t, "auto_revert"),
	}
	// read, when set, is what an apply read of the nodes' newest wants
	// while rollout readOver was the fleet's newest: its start, later,
	// diffs against them and names readOver as the rollout it
	// supersedes (rollout.Start.Supersedes), as apply does; steps stored
	// meanwhile are newer than what it read (a fresh user's finding G2).
	var (
		read     map[string]uint64
		readOver uint64
	)
	newest := func() uint64 {
		if h.state.Rollout == nil {
			return 0
		}
		return h.state.Rollout.ID
	}
	begin := func() {
		sp := *p // each start its own: the stream keeps the payload
		seen := h.newest
		if read != nil && readOver == newest() {
			seen = read // read before: apply's fence lets it start
		}
		sp.Supersedes, read = newest(), nil
		for _, name := range names {
			n := rollout.NodeAtStart{Node: name, Want: rapid.IntRange(0, 2).Draw(t, "want "+name), Prev: seen[name]}
			n.Down = rapid.IntRange(0, 9).Draw(t, "down "+name) == 0
			sp.Nodes = append(sp.Nodes, n)
		}
		h.append(t, rollout.Input{Kind: rollout.KindStart, Payload: rollout.Stamp(&sp, h.now)})
		if len(h.held) > 0 && rapid.Bool().Draw(t, "in flight") {
			// The wants the controller decided while stalled, the
			// superseded rollout's first, reach the server now.
			held := h.held
			h.stall, h.held = false, nil
			for _, e := range held {
				h.carry(t, e)
			}
		}
	}
	begin()
	steps := rapid.IntRange(1, 80).Draw(t, "steps")
	for range steps {
		node := rapid.SampledFrom(names).Draw(t, "node")
		switch rapid.IntRange(0, 16).Draw(t, "action") {
		case 0, 1, 2:
			h.plan(t, node, rapid.SampledFrom([]string{"", "", "db"}).Draw(t, "held"))
		case 3, 4:
			op := rapid.SampledFrom([]events.SettleOp{events.OpApply, events.OpApply, events.OpFailed}).Draw(t, "op")
			h.node(t, node, rollout.KindSettle, &events.Settle{Op: op, Plan: h.plans[node], Error: "boom"})
		case 5, 6, 7:
			hv := &rollout.Have{}
			for _, m := range h.wants[h.newest[node]] {
				hv.Modules = append(hv.Modules, rollout.HaveModule{Name: m.Name, Build: m.Build,
					State:    rapid.SampledFrom([]events.RunState{events.Running, events.Running, events.Running, events.Failed}).Draw(t, "state"),
					Health:   rapid.SampledFrom([]rollout.Health{"", rollout.Healthy, rollout.Starting, rollout.Unhealthy}).Draw(t, "health"),
					Restarts: rapid.IntRange(0, 4).Draw(t, "restarts")})
			}
			h.node(t, node, rollout.KindHave, hv)
		case 8:
			switch k := rapid.SampledFrom([]rollout.Kind{rollout.KindDown, rollout.KindUp, rollout.KindNodePause, rollout.KindNodeResume, rollout.KindNodeRetire}).Draw(t, "liveness"); k {
			case rollout.KindNodePause:
				h.node(t, node, k, &events.Pause{By: "ops", Reason: "disk"})
			case rollout.KindNodeRetire:
				h.node(t, node, k, &events.Retire{By: "ops"})
			default:
				h.node(t, node, k, nil)
			}
		case 9, 10:
			h.now = h.now.Add(time.Duration(rapid.IntRange(1, 120).Draw(t, "wait")) * time.Second)
			h.append(t, rollout.Input{Kind: rollout.KindTick, Payload: &rollout.Tick{}})
		case 11:
			k := rapid.SampledFrom([]rollout.Kind{rollout.KindPromote, rollout.KindPromote, rollout.KindPause, rollout.KindResume, rollout.KindAbort, rollout.KindRevert}).Draw(t, "verb")
			h.append(t, rollout.Input{Kind: k, Payload: rollout.NewOperator(k, 0, "ops", "")})
		case 12:
			if rapid.IntRange(0, 3).Draw(t, "by hand") == 0 {
				h.addWant(t, node, []events.WantModule{{Name: "web", Build: "b9"}}, "")
			}
		case 13:
			// The controller stalls (its wants are not published) or
			// restarts and publishes what is pending.
			if h.stall {
				h.stall = false
				for _, e := range h.state.Pending() {
					h.carry(t, e)
				}
			} else {
				h.stall = true
			}
		case 14, 15:
			h.plan(t, node, "")
			h.node(t, node, rollout.KindSettle, &events.Settle{Op: events.OpApply, Plan: h.plans[node]})
		case 16:
			// Now and then a new apply, which supersedes an active
			// rollout; or an apply's read of the fleet, started later.
			switch rapid.IntRange(0, 4).Draw(t, "again") {
			case 0:
				begin()
			case 1:
				read, readOver = maps.Clone(h.newest), newest()
			}
		}
	}
	return h
}

// revertHistory drives a harness with a random rollout that gets far
// enough for a revert to meet targets done (history rarely does): a
// fleet of 3 to 8 nodes, every one a target, no canary; nodes take their
// newest want healthy and time passes until some are done; then random
// crash loops (a failure, and auto_revert), a revert verb, agents going
// down and up, pauses, wants by hand, retires, an abort, and nodes
// taking their newest want, healthy or not.
func revertHistory(t *rapid.T) *harness {
	h := newHarness("web")
	h.quiet = true
	count := rapid.IntRange(3, 8).Draw(t, "nodes")
	var names []string
	p := &rollout.Start{By: "ops", Pages: 1, Wants: [][]events.WantModule{{{Name: "web", Build: "b2"}}}}
	for i := range count {
		name := fmt.Sprintf("n%d", i)
		names = append(names, name)
		h.addWant(t, name, []events.WantModule{{Name: "web", Build: "b1"}}, "")
		p.Nodes = append(p.Nodes, rollout.NodeAtStart{Node: name, Want: 1, Prev: h.newest[name], Down: rapid.IntRange(0, 9).Draw(t, "down "+name) == 0})
	}
	p.Params = rollout.Params{
		Batch:           rollout.Amount{N: rapid.IntRange(1, 8).Draw(t, "batch")},
		MaxUnavailable:  rollout.Amount{N: rapid.IntRange(1, 4).Draw(t, "max_unavailable")},
		MinHealthy:      rollout.Duration(time.Duration(rapid.IntRange(0, 5).Draw(t, "min_healthy")) * time.Second).Ptr(),
		HealthyDeadline: rollout.Duration(time.Duration(rapid.IntRange(30, 120).Draw(t, "healthy_deadline")) * time.Second),
		AutoRevert:      rapid.Bool().Draw(t, "auto_revert"),
	}
	h.append(t, rollout.Input{Kind: rollout.KindStart, Payload: rollout.Stamp(p, h.now)})
	// take makes node take its newest want: plan, settle, have.
	take := func(node string, state events.RunState, health rollout.Health, restarts int) {
		h.plan(t, node, "")
		h.node(t, node, rollout.KindSettle, &events.Settle{Op: events.OpApply, Plan: h.plans[node]})
		hv := &rollout.Have{}
		for _, m := range h.wants[h.newest[node]] {
			hv.Modules = append(hv.Modules, rollout.HaveModule{Name: m.Name, Build: m.Build, State: state, Health: health, Restarts: restarts})
		}
		h.node(t, node, rollout.KindHave, hv)
	}
	tick := func(d time.Duration) {
		h.now = h.now.Add(d)
		h.append(t, rollout.Input{Kind: rollout.KindTick, Payload: &rollout.Tick{}})
	}
	for range rapid.IntRange(0, 3*count).Draw(t, "healthy steps") {
		if rapid.Bool().Draw(t, "tick") {
			tick(6 * time.Second)
		} else {
			take(rapid.SampledFrom(names).Draw(t, "node"), events.Running, rollout.Healthy, 0)
		}
	}
	for range rapid.IntRange(1, 40).Draw(t, "steps") {
		node := rapid.SampledFrom(names).Draw(t, "node")
		switch rapid.IntRange(0, 13).Draw(t, "action") {
		case 0, 1, 2:
			take(node, events.Running, rapid.SampledFrom([]rollout.Health{rollout.Healthy, rollout.Healthy, rollout.Starting, rollout.Unhealthy}).Draw(t, "health"), 0)
		case 3:
			take(node, events.Failed, "", 3) // a crash loop, at its newest want
		case 4:
			h.append(t, rollout.Input{Kind: rollout.KindRevert, Payload: rollout.NewOperator(rollout.KindRevert, 0, "ops", "")})
		case 5:
			h.node(t, node, rapid.SampledFrom([]rollout.Kind{rollout.KindDown, rollout.KindUp}).Draw(t, "liveness"), nil)
		case 6:
			if rapid.Bool().Draw(t, "pause") {
				h.node(t, node, rollout.KindNodePause, &events.Pause{By: "ops"})
			} else {
				h.node(t, node, rollout.KindNodeResume, nil)
			}
		case 7:
			h.addWant(t, node, []events.WantModule{{Name: "web", Build: "b9"}}, "")
		case 8:
			if rapid.IntRange(0, 3).Draw(t, "retire or abort") == 0 {
				h.append(t, rollout.Input{Kind: rollout.KindAbort, Payload: rollout.NewOperator(rollout.KindAbort, 0, "ops", "")})
			} else {
				h.node(t, node, rollout.KindNodeRetire, &events.Retire{By: "ops"})
			}
		case 9, 10, 11:
			tick(time.Duration(rapid.IntRange(1, 40).Draw(t, "wait")) * time.Second)
		case 12:
			// A plan of its newest want the controller cannot verify (the
			// reconciler's old key, or a forgery), settled, failed or not
			// at all: the rollout pauses on it.
			h.unverified = "effect signed by an untrusted key: NOLD"
			h.plan(t, node, "")
			h.unverified = ""
			switch rapid.IntRange(0, 2).Draw(t, "its settle") {
			case 0:
				h.node(t, node, rollout.KindSettle, &events.Settle{Op: events.OpApply, Plan: h.plans[node]})
			case 1:
				h.node(t, node, rollout.KindSettle, &events.Settle{Op: events.OpFailed, Plan: h.plans[node], Error: "boom", Untrusted: rapid.Bool().Draw(t, "untrusted")})
			}
		case 13:
			h.append(t, rollout.Input{Kind: rollout.KindResume, Payload: rollout.NewOperator(rollout.KindResume, 0, "ops", "")})
		}
	}
	return h
}

// anyHistory draws one of the two random histories.
func anyHistory(t *rapid.T) *harness {
	if rapid.Bool().Draw(t, "reverts") {
		return revertHistory(t)
	}
	return history(t)
}

// TestReplay: folding the stream again, from the first event or from a
// snapshot taken anywhere, gives the same state and the same effects
// with the same ids (DESIGN.md §5.1).
func TestReplay(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := anyHistory(t)
		cut := rapid.IntRange(0, len(h.stream)).Draw(t, "snapshot at")
		s := rollout.NewState("web")
		var effs []rollout.Effect
		for i, in := range h.stream {
			if i == cut {
				b, err := json.Marshal(s)
				if err != nil {
					t.Fatal(err)
				}
				if s, err = rollout.UnmarshalState(b); err != nil {
					t.Fatalf("snapshot at %d: %v", cut, err)
				}
			}
			effs = append(effs, s.Fold(in)...)
			if again := s.Fold(in); again != nil {
				t.Fatalf("refolding #%d gave %d effects", in.Seq, len(again))
			}
		}
		want, _ := json.Marshal(h.state)
		got, _ := json.Marshal(s)
		if string(want) != string(got) {
			t.Fatalf("replayed state differs:\nlive   %s\nreplay %s", want, got)
		}
		if len(effs) != len(h.effect) {
			t.Fatalf("replay made %d effects, the live run %d", len(effs), len(h.effect))
		}
		for i := range effs {
			a, _ := json.Marshal(effs[i])
			b, _ := json.Marshal(h.effect[i])
			if string(a) != string(b) || effs[i].ID() != h.effect[i].ID() {
				t.Fatalf("effect %d differs:\nlive   %s %s\nreplay %s %s", i, b, h.effect[i].ID(), a, effs[i].ID())
			}
		}
	})
}

// unavailable counts the fleet's nodes unavailable (DESIGN.md §11), from
// the state's fields, apart from the fold's own count.
func unavailable(r *rollout.Rollout) int {
	c := 0
	for _, n := range r.Nodes {
		switch {
		case n.Down, n.Paused != nil, len(n.Unhealthy) > 0:
			c++
		case n.Back != nil && n.Back.Status != rollout.RevertQueued:
			// Its revert spends the budget until it ends, and when it
			// failed until its previous want runs after all; a revert
			// waiting for the budget spends none of it.
			if slices.Contains([]rollout.Status{rollout.RevertWaiting, rollout.RevertPublishing, rollout.RevertChanging}, n.Back.Status) ||
				n.Back.Status == rollout.RevertFailed && !runsBack(n) {
				c++
			}
		case slices.Contains([]rollout.Status{rollout.Publishing, rollout.Changing, rollout.WaitingApproval, rollout.Failed}, n.Status):
			c++
		}
	}
	return c
}

// runsBack reports whether a target runs the previous want its revert
// gave back: the want's plan settled and every module of it runs at its
// build, healthy or without a check, by a have since its agent's down.
func runsBack(n *rollout.Node) bool {
	p := n.Plan
	if p == nil || p.Want != n.Back.Want || n.Back.Want == 0 || n.Settled < p.Seq || n.Have == nil || n.Have.Stale {
		return false
	}
	for _, row := range p.Rows {
		if row.Build == "" {
			continue
		}
		i := slices.IndexFunc(n.Have.Modules, func(m rollout.HaveModule) bool { return m.Name == row.Name })
		if i < 0 {
			return false
		}
		if m := n.Have.Modules[i]; m.Build != row.Build || m.State != events.Running || m.Health == rollout.Unhealthy || m.Health == rollout.Starting {
			return false
		}
	}
	return true
}

// TestBudget: no target gets its new want while the budget is spent:
// after any fold that gave forward wants, at most max_unavailable of the
// fleet's nodes are unavailable, but for the targets a step spends
// nothing on (a module of it unhealthy or failed already, not away):
// those still pending, which take their want in their batch's turn
// whatever the budget, and those given their want in that fold (fresh
// users' findings G1: counting them held the earlier batches, the
// canary first, for good). Each target given one was pending before. A
// forward want is given only to a target once, and never twice by id.
func TestBudget(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := history(t)
		s := rollout.NewState("web")
		ids := map[string]bool{}
		for _, in := range h.stream {
			before := s.Clone()
			effs := s.Fold(in)
			r := s.Rollout
			// A step to a target unhealthy already, not away, spends
			// nothing: it makes no node unavailable that was not.
			spendsNothing := func(n *rollout.Node) bool {
				return len(n.Unhealthy) > 0 && !n.Down && n.Paused == nil
			}
			free := 0 // unavailable nodes the budget does not count
			if r != nil {
				for _, n := range r.Nodes {
					if n.Want > 0 && n.Status == rollout.Pending && spendsNothing(n) {
						free++
					}
				}
			}
			for _, e := range effs {
				if w := e.Want; w != nil && w.Step == rollout.StepForward && spendsNothing(r.Nodes[w.Node]) {
					free++
				}
			}
			for _, e := range effs {
				if e.Want == nil || e.Want.Step != rollout.StepForward {
					continue
				}
				if ids[e.ID()] {
					t.Fatalf("#%d: want %s given twice", in.Seq, e.ID())
				}
				ids[e.ID()] = true
				if before.Rollout == nil || in.Kind == rollout.KindStart {
					// A start's first steps: every target was pending.
				} else if n := before.Rollout.Nodes[e.Want.Node]; n.Status != rollout.Pending {
					t.Fatalf("#%d: %s given its want while %s", in.Seq, e.Want.Node, n.Status)
				}
				if u := unavailable(r); u-free > r.R.MaxUnavailable && !spendsNothing(r.Nodes[e.Want.Node]) {
					t.Fatalf("#%d: %s given its want, %d nodes unavailable after (%d of them unhealthy targets a step spends nothing on), max_unavailable %d", in.Seq, e.Want.Node, u, free, r.R.MaxUnavailable)
				}
				if u := unavailable(r); u != r.Unavailable {
					t.Fatalf("#%d: counted %d unavailable, %d are", in.Seq, r.Unavailable, u)
				}
			}
		}
	})
}

// TestRevertBudget: a revert keeps the rollout's budget (a fresh user's
// finding L1: every changed target was given back at once). After any
// fold that gave a target its previous want back while the target was
// available but for that revert (its agent up, not paused, no module
// unhealthy, neither failed nor being changed by the rollout before),
// at most max_unavailable of the fleet's nodes are unavailable, as the
// fold counts them and as the state's fields say, but for the targets
// the rollout never changed whose module is unhealthy or failed already
// (agent up, not paused): the steps it gives back did not count them
// either (fresh7's finding G1). (That a target
// unavailable itself never waits for the budget, nor one while the
// budget is free, is State.CheckInvariants', checked after every fold.)
func TestRevertBudget(t *testing.T) {
	spends := 0
	rapid.Check(t, func(t *rapid.T) {
		h := revertHistory(t)
		s := rollout.NewState("web")
		for _, in := range h.stream {
			before := s.Clone()
			for _, e := range s.Fold(in) {
				w := e.Want
				if w == nil || w.Step != rollout.StepRevert || before.Rollout == nil || before.Rollout.ID != s.Rollout.ID {
					continue
				}
				was, n := before.Rollout.Nodes[w.Node], s.Rollout.Nodes[w.Node]
				if n.Down || n.Paused != nil || len(n.Unhealthy) > 0 || slices.Contains([]rollout.Status{rollout.Publishing, rollout.Changing, rollout.WaitingApproval, rollout.Failed}, was.Status) {
					continue // unavailable already: its revert spends nothing more
				}
				spends++
				r := s.Rollout
				never := 0 // never changed, unhealthy already: not counted
				for _, o := range r.Nodes {
					if o.Want > 0 && o.Status == rollout.Pending && len(o.Unhealthy) > 0 && !o.Down && o.Paused == nil {
						never++
					}
				}
				if u := unavailable(r); u-never > r.R.MaxUnavailable || u != r.Unavailable {
					t.Fatalf("#%d (%s): %s given its previous want back: %d nodes unavailable after (counted %d, %d of them never changed and unhealthy), max_unavailable %d", in.Seq, in.Kind, w.Node, u, r.Unavailable, never, r.R.MaxUnavailable)
				}
			}
		}
	})
	if spends == 0 {
		t.Fatal("no history gave an available target its previous want back")
	}
	t.Logf("%d reverts of available targets checked", spends)
}

// TestUnverifiedDecidesNothing: while a rollout is paused on a plan its
// controller cannot verify, no fold but an operator's resume (or a new
// start) publishes a want, forward or revert: it gives no target its new
// want nor its previous want back on what it cannot see
// (docs/architecture.md, "A rollout halted or reverting when the key
// changes pauses too").
func TestUnverifiedDecidesNothing(t *testing.T) {
	paused := 0
	rapid.Check(t, func(t *rapid.T) {
		h := revertHistory(t)
		s := rollout.NewState("web")
		for _, in := range h.stream {
			r := s.Rollout
			fenced := r != nil && r.Unverified != nil && !r.Phase.Final()
			effs := s.Fold(in)
			if !fenced || in.Kind == rollout.KindResume || in.Kind == rollout.KindStart {
				continue
			}
			paused++
			for _, e := range effs {
				if e.Want != nil {
					t.Fatalf("#%d (%s): paused on %s's unverified plan #%d (%s), the fold gave %s its %s want", in.Seq, in.Kind, r.Unverified.Node, r.Unverified.Seq, r.Phase, e.Want.Node, e.Want.Step)
				}
			}
		}
	})
	if paused == 0 {
		t.Fatal("no history paused on an unverified plan")
	}
	t.Logf("%d folds while paused checked", paused)
}

// TestHaltedPublishesNoForwardWant: once a rollout halted (or ended), no
// fold gives any target its new want, until a new start.
func TestHaltedPublishesNoForwardWant(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := history(t)
		s := rollout.NewState("web")
		stopped := rollout.Phase("")
		for _, in := range h.stream {
			effs := s.Fold(in)
			if in.Kind == rollout.KindStart {
				stopped = ""
			}
			if stopped != "" {
				for _, e := range effs {
					if e.Want != nil && e.Want.Step == rollout.StepForward {
						t.Fatalf("#%d: rollout %s, yet %s given its new want", in.Seq, stopped, e.Want.Node)
					}
				}
			}
			if r := s.Rollout; r != nil && stopped == "" {
				switch r.Phase {
				case rollout.Halted, rollout.Reverting, rollout.Reverted, rollout.Aborted, rollout.Completed:
					stopped = r.Phase
				}
			}
		}
	})
}

// TestNeverOverwritten: a target in conflict (its want changed by hand)
// is never given a want again, not even its previous one back; every
// want is published against the newest want the rollout knew of its
// node; no target is given its previous want twice.
func TestNeverOverwritten(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := anyHistory(t)
		s := rollout.NewState("web")
		back := map[string]bool{}
		for _, in := range h.stream {
			before := s.Clone()
			for _, e := range s.Fold(in) {
				w := e.Want
				if w == nil || before.Rollout == nil || in.Kind == rollout.KindStart {
					continue
				}
				n := before.Rollout.Nodes[w.Node]
				if n.Status == rollout.Conflict {
					t.Fatalf("#%d: %s in conflict given a %s want", in.Seq, w.Node, w.Step)
				}
				if w.Step == rollout.StepRevert {
					if back[e.ID()] {
						t.Fatalf("#%d: %s given its previous want twice", in.Seq, w.Node)
					}
					back[e.ID()] = true
					if w.Expect != s.Rollout.Nodes[w.Node].Published || w.Expect < n.NewestWant {
						t.Fatalf("#%d: revert of %s expects #%d; the rollout's want is #%d, the newest known #%d", in.Seq, w.Node, w.Expect, n.Published, n.NewestWant)
					}
				} else if after := s.Rollout.Nodes[w.Node]; w.Expect != after.Expect() || after.NewestWant != after.Expect() || (after.Adopted == 0 && w.Expect != n.Prev) {
					// Prev, or a want of the rollout it superseded
					// (Node.Adopted), which may be taken in that fold.
					t.Fatalf("#%d: %s's want expects #%d; diffed against #%d, adopted #%d, newest known #%d", in.Seq, w.Node, w.Expect, n.Prev, after.Adopted, after.NewestWant)
				}
			}
		}
	})
}

// TestIdleWaitsForARolloutEvent: once a rollout is idle (State.Idle),
// only one of the fleet's rollout events that a person publishes (a
// start, its pages, a verb) can make it decide a want, record anything
// but a conflict (a want changed by hand after the end) or stop being
// idle; the nodes' events, ticks and the controller's own records change
// nothing else it does. So an idle controller may stop reading the nodes'
// events and refold from the start when such an event comes
// (docs/architecture.md, "Rollouts: the controller").
func TestIdleWaitsForARolloutEvent(t *testing.T) {
	wakes := map[rollout.Kind]bool{rollout.KindStart: true, rollout.KindNodes: true, rollout.KindPromote: true,
		rollout.KindPause: true, rollout.KindResume: true, rollout.KindAbort: true, rollout.KindRevert: true}
	rapid.Check(t, func(t *rapid.T) {
		h := anyHistory(t)
		s := rollout.NewState("web")
		for _, in := range h.stream {
			idle := s.Rollout != nil && s.Idle()
			effs := s.Fold(in)
			if !idle || wakes[in.Kind] {
				continue
			}
			for _, e := range effs {
				switch {
				case e.Want != nil:
					t.Fatalf("#%d %s: an idle rollout (%s) gave %s a %s want", in.Seq, in.Kind, s.Rollout.Phase, e.Want.Node, e.Want.Step)
				case e.Record.What != string(rollout.Conflict):
					// A want changed by hand after the end is the one
					// record an idle rollout makes: a refold records it
					// when a verb or start wakes the controller.
					t.Fatalf("#%d %s: an idle rollout (%s) recorded %s: %s", in.Seq, in.Kind, s.Rollout.Phase, e.Record.What, e.Record.Msg)
				}
			}
			if !s.Idle() {
				t.Fatalf("#%d %s: an idle rollout (%s) stopped being idle", in.Seq, in.Kind, s.Rollout.Phase)
			}
		}
	})
}

// TestCanaryPassesOnlyWhenTried: a rollout with a canary waits for a
// promote, and a target past the canary batch gets its new want, only
// once a canary target ran the new build (done) and every other one is
// done or retired (skipped): a canary whose agent is down, paused or
// unreached, or that never settled, never lets an untried build on to
// the fleet (a user's report: a canary down before apply reached
// waiting-promote).
func TestCanaryPassesOnlyWhenTried(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := history(t)
		s := rollout.NewState("web")
		for _, in := range h.stream {
			effs := s.Fold(in)
			r := s.Rollout
			if r == nil || r.R.Canary == 0 || r.Phase == rollout.Loading {
				continue
			}
			tried := func(what string) {
				done := 0
				for _, name := range r.Targets[:min(r.R.Canary, len(r.Targets))] {
					switch n := r.Nodes[name]; n.Status {
					case rollout.Done:
						done++
					case rollout.Skipped:
					default:
						t.Fatalf("#%d: %s while canary %s is %s (down %v, paused %v)", in.Seq, what, name, n.Status, n.Down, n.Paused != nil)
					}
				}
				if done == 0 {
					t.Fatalf("#%d: %s with no canary target done", in.Seq, what)
				}
			}
			if r.Phase == rollout.WaitingPromote {
				tried("waiting-promote")
			}
			for _, e := range effs {
				if w := e.Want; w != nil && w.Step == rollout.StepForward && r.Nodes[w.Node].Batch > 0 && r.Promoted != nil && r.Promoted.Seq == in.Seq {
					tried("promoted and " + w.Node + " given its want")
				}
			}
		}
	})
}

// TestGivesBackNamesEveryRevert: every previous want a fold gives back
// (a revert step's want) is one State.GivesBack named just before: what
// `meshfold build rm` reads to keep the builds a revert would need.
func TestGivesBackNamesEveryRevert(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := anyHistory(t)
		s := rollout.NewState("web")
		for _, in := range h.stream {
			named := map[string]bool{}
			for _, n := range s.GivesBack() {
				named[n.Name] = true
			}
			for _, e := range s.Fold(in) {
				if w := e.Want; w != nil && w.Step == rollout.StepRevert && w.CopyOf != 0 && !named[w.Node] {
					t.Fatalf("#%d (%s): %s given its previous want #%d back; GivesBack named %v", in.Seq, in.Kind, w.Node, w.CopyOf, named)
				}
			}
		}
	})
}

// TestSupersededStepIsNoConflict: a want the rollout that a start
// supersedes knowingly (rollout.Start.Supersedes, as apply reads it)
// stored on a target after apply read the target is never the target's
// conflict, nor what halts the new rollout; the target's step expects
// it instead (a fresh user's finding G2). The one exception: a step
// refused for it once the rollout halted or reverts, which gives no
// target its new want. Any other writer's want still
// is a conflict (TestNeverOverwritten). Histories where an apply read
// the fleet before the current rollout's steps landed, and where the
// superseded rollout's wants were in flight when the new start was
// stored, are both drawn (history).
func TestSupersededStepIsNoConflict(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := history(t)
		s := rollout.NewState("web")
		for _, in := range h.stream {
			forward := s.Rollout != nil && (s.Rollout.Phase == rollout.Running || s.Rollout.Phase == rollout.WaitingPromote) && s.Rollout.Unverified == nil
			for _, e := range s.Fold(in) {
				rec := e.Record
				if rec == nil || rec.What != string(rollout.Conflict) || s.Rollout == nil || s.Rollout.Over == 0 || !forward && in.Kind == rollout.KindRefused {
					// Halted or reverting, a target whose step was
					// refused gets no new want: it keeps the
					// superseded rollout's, as a conflict does.
					continue
				}
				n := s.Rollout.Nodes[rec.Node]
				if _, id, node, _, ok := rollout.ParseWantID(n.NewestID); ok && id == s.Rollout.Over && node == n.Name && !n.Again {
					t.Fatalf("#%d: %s in conflict over rollout %d's own step (%s), which rollout %d superseded: %s", in.Seq, n.Name, id, n.NewestID, s.Rollout.ID, rec.Msg)
				}
			}
		}
	})
}
