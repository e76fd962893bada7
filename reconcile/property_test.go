package reconcile_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
)

// tb is what the helpers need of *testing.T and *rapid.T.
type tb interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// sim is one node's history on reconciletest's stream, which folds every
// event appended and appends the effects after it (and folds the plans,
// as the reconciler reads its own plan events); sim checks the state's
// invariants after every fold and adds what the properties read.
type sim struct {
	*reconciletest.Stream
	t     tb
	state *reconcile.State
}

func newSim(t tb) *sim { return newSimOf(t, nil) }

// newSimOf is newSim whose state newState makes (nil: reconcile.NewState).
func newSimOf(t tb, newState func(string) *reconcile.State) *sim {
	s := &sim{Stream: reconciletest.New(base, time.Second), t: t}
	s.NewState = newState
	s.Live = func(ev events.Event, st *reconcile.State) {
		if err := st.CheckInvariants(); err != nil {
			s.t.Fatalf("after #%d %s: %v", ev.Seq, ev.Kind, err)
		}
	}
	s.state = s.State("ace")
	return s
}

// add appends p as the node's event and returns its sequence.
func (s *sim) add(p events.Payload) uint64 { return s.Append("ace", p).Seq }

// addOlder appends w as a build before the gate wrote it: no "gates"
// (events.Want.Gates), which anyone holding the controller's credentials
// may publish too.
func (s *sim) addOlder(w *events.Want) uint64 {
	events.Stamp(w, time.Unix(0, 0))
	w.Gates = false
	return s.AppendEvent(events.Event{Node: "ace", Kind: events.KindWant, Payload: w}).Seq
}

// plans returns the sequences of the node's plan events.
func (s *sim) plans() []uint64 { return s.Plans("ace") }

// plan returns the plan event at seq.
func (s *sim) plan(seq uint64) *events.Plan {
	ev, ok := s.Event(seq)
	if !ok {
		s.t.Fatalf("no event #%d", seq)
	}
	return ev.Payload.(*events.Plan)
}

// knocked returns every owed item knocked, with the count of knocks that
// carried it.
func (s *sim) knocked() map[events.Owed]int {
	out := map[events.Owed]int{}
	for _, ev := range s.Events {
		for _, e := range s.Effects(ev.Seq) {
			if k, ok := e.Payload.(*events.Knock); ok {
				for _, o := range k.Owed {
					out[o]++
				}
			}
		}
	}
	return out
}

func (s *sim) owed() []events.Owed {
	var out []events.Owed
	for _, it := range s.state.Owed {
		out = append(out, it.Owed)
	}
	return out
}

// scenario is a node's history for the order-independence property: wants
// whose plans are all published first, then settles (in plan order) and
// refusals, interleaved.
type scenario struct {
	wants    []*events.Want
	settle   []int // indexes of the plans to settle, increasing
	refusals []refusalSpec
}

// refusalSpec names a plan by index (-1 for plan 0, before any settled).
type refusalSpec struct {
	module, path, writer string
	plan                 int
}

// prefix folds the wants and their plan events and returns the sim.
func (sc scenario) prefix(t tb) *sim {
	s := newSim(t)
	for _, w := range sc.wants {
		s.add(&events.Want{Modules: w.Modules})
	}
	if len(s.plans()) != len(sc.wants) {
		t.Fatalf("%d wants made %d plans", len(sc.wants), len(s.plans()))
	}
	return s
}

// refusal builds the refusal event of spec, with the reason the node's
// judge gives against that plan; ok false when the judge accepts it.
func (sc scenario) refusal(s *sim, r refusalSpec) (*events.Refusal, bool) {
	var account string
	var rows []events.PlanModule
	plan := uint64(0)
	if r.plan >= 0 {
		p := s.plan(s.plans()[r.plan])
		account, rows, plan = p.ProvisionerAccount, p.Modules, s.plans()[r.plan]
	}
	_, reason := reconcile.Judge(account, rows, r.module, r.path, r.writer)
	if reason == "" {
		return nil, false
	}
	return &events.Refusal{Module: r.module, Path: r.path, Reason: reason, Plan: plan, Writer: r.writer}, true
}

// expected is the property's oracle: the refusals that some settled plan
// newer than their own accepts, but for a file the newest want (the last:
// the wants come first) no longer declares that a settled plan accepted:
// a want removed it, and it owes nothing (docs/architecture.md, "An owed
// item of a file the want removed").
func (sc scenario) expected(s *sim, refs []*events.Refusal) map[events.Owed]int {
	out := map[events.Owed]int{}
	last := sc.wants[len(sc.wants)-1]
	for _, r := range refs {
		removed := false
		if !slices.ContainsFunc(last.Modules, func(m events.WantModule) bool {
			return m.Name == r.Module && slices.ContainsFunc(m.Files, func(f events.File) bool { return f.Path == r.Path })
		}) {
			for _, i := range sc.settle {
				p := s.plan(s.plans()[i])
				if _, reason := reconcile.JudgePlan(p, r.Module, r.Path, p.ProvisionerAccount); reason == "" {
					removed = true
				}
			}
		}
		if removed {
			continue
		}
		for _, i := range sc.settle {
			p := s.plan(s.plans()[i])
			if s.plans()[i] <= r.Plan {
				continue
			}
			if _, reason := reconcile.JudgePlan(p, r.Module, r.Path, r.Writer); reason == "" {
				out[events.Owed{Module: r.Module, Path: r.Path, Reason: r.Reason, Plan: r.Plan, Writer: r.Writer}] = 1
			}
		}
	}
	return out
}

// run folds the scenario with the settles and refusals in the order given
// by order: true takes the next settle, false the next refusal.
func (sc scenario) run(t tb, order []bool) (owed []events.Owed, knocked map[events.Owed]int, refs []*events.Refusal) {
	s := sc.prefix(t)
	for _, r := range sc.refusals {
		if ref, ok := sc.refusal(s, r); ok {
			refs = append(refs, ref)
		}
	}
	si, ri := 0, 0
	for _, settle := range order {
		if settle {
			s.add(&events.Settle{Module: "app", Op: events.OpApply, Plan: s.plans()[sc.settle[si]]})
			si++
		} else if ri < len(refs) {
			r := *refs[ri]
			s.add(&r)
			ri++
		}
	}
	for ; ri < len(refs); ri++ {
		r := *refs[ri]
		s.add(&r)
	}
	all, exp := s.knocked(), sc.expected(s, refs)
	// Nothing is forgotten below the caps (DESIGN.md §4, "Bounded by
	// counts"): every refusal is knocked exactly as the oracle says.
	if !mapsEqual(all, exp) {
		t.Fatalf("order %v: knocked %v, oracle %v", order, all, exp)
	}
	return s.owed(), all, refs
}

func mapsEqual(a, b map[events.Owed]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func want(account string, files ...string) *events.Want {
	app := events.WantModule{Name: "app", Build: "a:1", RunsAs: "app"}
	for _, f := range files {
		app.Files = append(app.Files, events.File{Path: f, Mode: "0600"})
	}
	return &events.Want{Modules: []events.WantModule{
		{Name: "provisioner", Build: "p:1", RunsAs: account, Provisioner: true},
		app,
	}}
}

// TestOrderIndependenceExhaustive is DESIGN.md §5.2 over every
// interleaving of a small history: three plans that declare, drop and
// re-declare files under two accounts, their settles in plan order, and
// refusals judged by plan 0 and by each plan.
func TestOrderIndependenceExhaustive(t *testing.T) {
	sc := scenario{
		wants: []*events.Want{
			want("prov", "/a"),
			want("prov", "/b"),
			want("other", "/a", "/b"),
			want("prov", "/a", "/b", "/c"),
		},
		settle: []int{0, 1, 2, 3},
		refusals: []refusalSpec{
			{"app", "/c", "other", 3},
			{"app", "/b", "prov", 0},
			{"app", "/a", "prov", 1},
			{"app", "/c", "prov", 2},
			{"app", "/a", "other", 0},
		},
	}
	var first []events.Owed
	var firstKnocked map[events.Owed]int
	runs := 0
	n := len(sc.settle) + len(sc.refusals)
	// Every placement of the settles among n slots, and every order of
	// the refusals in the remaining ones.
	for mask := 0; mask < 1<<n; mask++ {
		if popcount(mask) != len(sc.settle) {
			continue
		}
		order := make([]bool, n)
		for i := range order {
			order[i] = mask&(1<<i) != 0
		}
		for perm := range permutations(len(sc.refusals)) {
			sc2 := sc
			sc2.refusals = make([]refusalSpec, len(perm))
			for i, j := range perm {
				sc2.refusals[i] = sc.refusals[j]
			}
			owed, knocked, _ := sc2.run(t, order)
			slices.SortFunc(owed, compareOwedT)
			runs++
			if first == nil && firstKnocked == nil {
				first, firstKnocked = owed, knocked
				if len(knocked) == 0 {
					t.Fatal("the scenario knocks nothing: it tests nothing")
				}
				continue
			}
			if !slices.Equal(owed, first) || !mapsEqual(knocked, firstKnocked) {
				t.Fatalf("order %v perm %v: owed %v knocked %v; first run owed %v knocked %v", order, perm, owed, knocked, first, firstKnocked)
			}
		}
	}
	t.Logf("%d interleavings agree: %d knocked, %d owed", runs, len(firstKnocked), len(first))
}

func compareOwedT(a, b events.Owed) int {
	return strings.Compare(fmt.Sprint(a), fmt.Sprint(b))
}

func popcount(x int) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}

// permutations yields every permutation of 0..n-1.
func permutations(n int) func(yield func([]int) bool) {
	return func(yield func([]int) bool) {
		p := make([]int, n)
		for i := range p {
			p[i] = i
		}
		var rec func(k int) bool
		rec = func(k int) bool {
			if k == n {
				return yield(slices.Clone(p))
			}
			for i := k; i < n; i++ {
				p[k], p[i] = p[i], p[k]
				if !rec(k + 1) {
					return false
				}
				p[k], p[i] = p[i], p[k]
			}
			return true
		}
		rec(0)
	}
}

var (
	paths    = []string{"/a", "/b", "/c"}
	accounts = []string{"prov", "other", ""}
	writers  = []string{"prov", "other"}
)

// TestOrderIndependenceRandom is DESIGN.md §5.2 over random histories and
// random interleavings, shrunk to the smallest failing one by rapid.
func TestOrderIndependenceRandom(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		// At most MaxUnsettled plans wait to settle: beyond it the state
		// drops the second oldest (DESIGN.md §10), which a settle then
		// cannot name.
		nw := rapid.IntRange(1, reconcile.MaxUnsettled).Draw(rt, "wants")
		sc := scenario{}
		for range nw {
			var files []string
			for _, p := range paths {
				if rapid.Bool().Draw(rt, "declares "+p) {
					files = append(files, p)
				}
			}
			sc.wants = append(sc.wants, want(rapid.SampledFrom(accounts).Draw(rt, "account"), files...))
		}
		for i := range nw {
			if rapid.Bool().Draw(rt, "settles") {
				sc.settle = append(sc.settle, i)
			}
		}
		seen := map[refusalSpec]bool{}
		for range rapid.IntRange(0, 6).Draw(rt, "refusals") {
			r := refusalSpec{"app", rapid.SampledFrom(paths).Draw(rt, "path"), rapid.SampledFrom(writers).Draw(rt, "writer"),
				rapid.IntRange(-1, nw-1).Draw(rt, "plan")}
			if !seen[r] {
				seen[r] = true
				sc.refusals = append(sc.refusals, r)
			}
		}
		n := len(sc.settle) + len(sc.refusals)
		// Two random interleavings must agree (each also agrees with the
		// oracle inside run).
		draw := func(label string) []bool {
			order := make([]bool, n)
			for i := range sc.settle {
				order[i] = true
			}
			return rapid.Permutation(order).Draw(rt, label)
		}
		owed1, k1, _ := sc.run(rt, draw("order1"))
		owed2, k2, _ := sc.run(rt, draw("order2"))
		slices.SortFunc(owed1, compareOwedT)
		slices.SortFunc(owed2, compareOwedT)
		if !slices.Equal(owed1, owed2) || !mapsEqual(k1, k2) {
			rt.Fatalf("owed %v vs %v; knocked %v vs %v", owed1, owed2, k1, k2)
		}
	})
}

// churnPaths are the paths random histories declare, a few at a time.
var churnPaths = []string{"/a", "/b", "/c", "/d", "/e", "/f", "/g", "/h"}

// randomHistory appends a random history of every input kind to s.
func randomHistory(rt *rapid.T, s *sim, n int) {
	modules := []string{"provisioner", "app", "db"}
	builds := []string{"b1", "b2", "b3", "b4"}
	for i := range n {
		switch rapid.IntRange(0, 13).Draw(rt, fmt.Sprint("kind", i)) {
		case 0, 1:
			w := &events.Want{}
			for j, m := range modules {
				if !rapid.Bool().Draw(rt, "has "+m) {
					continue
				}
				wm := events.WantModule{Name: m, Build: rapid.SampledFrom(builds).Draw(rt, "build"),
					RunsAs:           rapid.SampledFrom(accounts).Draw(rt, "runs_as"),
					Provisioner:      m == "provisioner",
					RequiresApproval: rapid.Bool().Draw(rt, "requires_approval"),
					Hold:             rapid.IntRange(0, 4).Draw(rt, "hold") == 0}
				if m != "provisioner" {
					// Wants change paths: each declares a few of many,
					// so files leave the want and come back.
					for _, p := range churnPaths {
						if rapid.IntRange(0, 2).Draw(rt, "file") == 0 {
							wm.Files = append(wm.Files, events.File{Path: fmt.Sprintf("/%d%s", j, p), Mode: "0600"})
						}
					}
				}
				w.Modules = append(w.Modules, wm)
			}
			if rapid.IntRange(0, 3).Draw(rt, "older build") == 0 {
				s.addOlder(w)
			} else {
				s.add(w)
			}
		case 2:
			s.add(&events.Approve{Module: rapid.SampledFrom(modules).Draw(rt, "module"), Build: rapid.SampledFrom(builds).Draw(rt, "build"), By: "ops"})
		case 3:
			// Now and then an agent that started with no plan
			// (planAgain publishes the last plan again).
			h := &events.Have{NoPlan: rapid.IntRange(0, 4).Draw(rt, "no_plan") == 0}
			for _, m := range modules {
				if rapid.Bool().Draw(rt, "runs "+m) {
					h.Modules = append(h.Modules, events.HaveModule{Name: m, Build: rapid.SampledFrom(builds).Draw(rt, "build"),
						State: events.Running, Account: rapid.SampledFrom(accounts).Draw(rt, "account")})
				}
			}
			s.add(h)
		case 4, 5:
			if len(s.plans()) == 0 {
				continue
			}
			op := rapid.SampledFrom([]events.SettleOp{events.OpApply, events.OpApply, events.OpRemove, events.OpFailed}).Draw(rt, "op")
			s.add(&events.Settle{Module: rapid.SampledFrom(modules).Draw(rt, "module"), Op: op, Plan: rapid.SampledFrom(s.plans()).Draw(rt, "plan")})
		case 6, 7, 8:
			plan := uint64(0)
			if len(s.plans()) > 0 && rapid.Bool().Draw(rt, "plan0") {
				plan = rapid.SampledFrom(s.plans()).Draw(rt, "plan")
			}
			s.add(&events.Refusal{Module: rapid.SampledFrom(modules[1:]).Draw(rt, "module"),
				Path:   fmt.Sprintf("/%d%s", rapid.IntRange(1, 2).Draw(rt, "m"), rapid.SampledFrom(churnPaths).Draw(rt, "path")),
				Reason: rapid.SampledFrom([]events.Reason{events.ReasonUndeclared, events.ReasonNoAccount, events.ReasonWrongAccount, events.ReasonWriteFailed}).Draw(rt, "reason"),
				Plan:   plan, Writer: rapid.SampledFrom(writers).Draw(rt, "writer")})
		case 9:
			if len(s.plans()) == 0 {
				continue
			}
			s.add(&events.Filled{Module: rapid.SampledFrom(modules[1:]).Draw(rt, "module"),
				Path: fmt.Sprintf("/%d%s", rapid.IntRange(1, 2).Draw(rt, "m"), rapid.SampledFrom(churnPaths).Draw(rt, "path")),
				Plan: rapid.SampledFrom(s.plans()).Draw(rt, "plan"), Digest: "d"})
		case 10:
			// The operator events of DESIGN.md §9.
			switch rapid.IntRange(0, 7).Draw(rt, "operator") {
			case 0:
				s.add(&events.Pause{By: "ops"})
			case 1:
				s.add(&events.Resume{By: "ops"})
			case 2:
				s.add(&events.Poke{By: "ops"})
			case 3:
				s.add(&events.Revoke{Module: rapid.SampledFrom(modules).Draw(rt, "module"), Build: rapid.SampledFrom(builds).Draw(rt, "build"), By: "ops"})
			case 4:
				s.add(&events.Waive{Module: rapid.SampledFrom(modules[1:]).Draw(rt, "module"),
					Path: fmt.Sprintf("/%d%s", rapid.IntRange(1, 2).Draw(rt, "m"), rapid.SampledFrom(paths).Draw(rt, "path")), By: "ops"})
			case 5:
				s.add(&events.Retire{By: "ops", Force: rapid.Bool().Draw(rt, "force")})
			case 6, 7:
				s.add(&events.Gate{Module: rapid.SampledFrom(modules).Draw(rt, "module"), Lift: rapid.Bool().Draw(rt, "lift"), By: "ops"})
			}
		case 11:
			s.add(&events.Pause{By: "ops"})
		case 12:
			s.add(&events.Resume{By: "ops"})
		case 13:
			s.add(&events.Approve{Module: rapid.SampledFrom(modules).Draw(rt, "module"), Build: rapid.SampledFrom(builds).Draw(rt, "build"), By: "ops"})
		}
	}
}

func encode(t tb, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestFoldTwiceIsOnce is DESIGN.md §5.4: the same event folded twice
// changes nothing the second time.
func TestFoldTwiceIsOnce(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := newSim(rt)
		randomHistory(rt, s, rapid.IntRange(1, 40).Draw(rt, "events"))
		// Refold every event of the stream, old and newest: nothing moves.
		before := encode(rt, s.state)
		for _, ev := range s.Events {
			if effs := s.state.Fold(ev); len(effs) != 0 {
				rt.Fatalf("refolding #%d gave %d effects", ev.Seq, len(effs))
			}
		}
		if after := encode(rt, s.state); after != before {
			rt.Fatalf("refolding changed the state:\n%s\n%s", before, after)
		}
	})
}

// TestSnapshotReplay is DESIGN.md §5.1: folding a prefix, encoding and
// decoding the state (a snapshot), then folding the rest gives the same
// state and the same effects, with the same ids, as folding everything.
func TestSnapshotReplay(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		live := newSim(rt)
		randomHistory(rt, live, rapid.IntRange(1, 40).Draw(rt, "events"))
		cut := rapid.IntRange(0, len(live.Events)).Draw(rt, "cut")

		st := reconcile.NewState("ace")
		var effs []reconcile.Effect
		for _, ev := range live.Events[:cut] {
			effs = append(effs, st.Fold(ev)...)
		}
		snap, err := json.Marshal(st)
		if err != nil {
			rt.Fatal(err)
		}
		st, err = reconcile.UnmarshalState(snap)
		if err != nil {
			rt.Fatal(err)
		}
		for _, ev := range live.Events[cut:] {
			effs = append(effs, st.Fold(ev)...)
		}
		if got, want := encode(rt, st), encode(rt, live.state); got != want {
			rt.Fatalf("state after snapshot at %d:\n%s\nlive:\n%s", cut, got, want)
		}
		var liveEffs []reconcile.Effect
		for _, ev := range live.Events {
			liveEffs = append(liveEffs, live.Effects(ev.Seq)...)
		}
		if len(effs) != len(liveEffs) {
			rt.Fatalf("%d effects, live %d", len(effs), len(liveEffs))
		}
		for i := range effs {
			if effs[i].ID() != liveEffs[i].ID() || encode(rt, effs[i].Payload) != encode(rt, liveEffs[i].Payload) {
				rt.Fatalf("effect %d: %s %s, live %s %s", i, effs[i].ID(), encode(rt, effs[i].Payload), liveEffs[i].ID(), encode(rt, liveEffs[i].Payload))
			}
		}
	})
}

// TestPauseHoldsPlans is the pause rule of DESIGN.md §9 over random
// histories: no event but a resume or a retire emits a plan while the node
// is paused (but the same plan published again for an agent that holds
// none, planAgain), a resume emits at most one, and knocks still flow (a
// poke while paused knocks).
func TestPauseHoldsPlans(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := newSim(rt)
		randomHistory(rt, s, rapid.IntRange(1, 60).Draw(rt, "events"))
		st := reconcile.NewState("ace")
		for _, ev := range s.Events {
			paused := st.Paused != nil
			var before []events.PlanModule
			if e := st.Emitted(); e != nil {
				before = slices.Clone(e.Modules)
			}
			effs := st.Fold(ev)
			plans, knocks, same := 0, 0, true
			for _, e := range effs {
				switch e.Kind {
				case events.KindPlan:
					plans++
					same = same && reflect.DeepEqual(e.Payload.(*events.Plan).Modules, before)
				case events.KindKnock:
					knocks++
				}
			}
			switch {
			case ev.Kind == events.KindResume && plans > 1:
				rt.Fatalf("#%d resume emitted %d plans", ev.Seq, plans)
			case paused && plans > 0 && ev.Kind != events.KindResume && ev.Kind != events.KindRetire &&
				!(plans == 1 && same && ev.Kind == events.KindHave && ev.Payload.(*events.Have).NoPlan):
				// A have of an agent that holds no plan gets the same
				// plan published again (planAgain): not a new plan.
				rt.Fatalf("#%d %s emitted a plan while paused", ev.Seq, ev.Kind)
			case ev.Kind == events.KindPoke && knocks != 1:
				rt.Fatalf("#%d poke made %d knocks", ev.Seq, knocks)
			}
		}
	})
}

// TestNoTimer is DESIGN.md §9's "no timer" (and §5.6): shifting every
// stream time of a history changes no decision: the same effects, with
// the same ids and the same payloads but for the at they copy.
func TestNoTimer(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := newSim(rt)
		randomHistory(rt, s, rapid.IntRange(1, 60).Draw(rt, "events"))
		shift := time.Duration(rapid.Int64Range(1, 1<<40).Draw(rt, "shift"))
		st := reconcile.NewState("ace")
		for _, ev := range s.Events {
			ev.Time = ev.Time.Add(shift)
			effs := st.Fold(ev)
			live := s.Effects(ev.Seq)
			if len(effs) != len(live) {
				rt.Fatalf("#%d: %d effects shifted, %d live", ev.Seq, len(effs), len(live))
			}
			for i := range effs {
				if effs[i].ID() != live[i].ID() || encode(rt, effs[i].Payload) != encode(rt, live[i].Payload) {
					rt.Fatalf("#%d: effect %s %s shifted, %s %s live", ev.Seq, effs[i].ID(), encode(rt, effs[i].Payload), live[i].ID(), encode(rt, live[i].Payload))
				}
			}
		}
	})
}

// TestWaiveOrderIndependence is the order independence DESIGN.md §9 allows
// a waive: a waive and a refusal of the same file, in either order, end
// with nothing owed for it and no knock for it, whatever settles follow.
// The refusal is judged by the newest settled plan (or plan 0 when none
// has settled), so it is not due when it arrives.
func TestWaiveOrderIndependence(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		nw := rapid.IntRange(1, 4).Draw(rt, "wants")
		var wants []*events.Want
		for range nw {
			var files []string
			for _, p := range paths {
				if rapid.Bool().Draw(rt, "declares "+p) {
					files = append(files, p)
				}
			}
			wants = append(wants, want(rapid.SampledFrom(accounts).Draw(rt, "account"), files...))
		}
		settledBefore := rapid.IntRange(0, nw).Draw(rt, "settled before")
		path := rapid.SampledFrom(paths).Draw(rt, "path")
		writer := rapid.SampledFrom(writers).Draw(rt, "writer")
		run := func(waiveFirst bool) (owed []events.Owed, knocked map[events.Owed]int) {
			s := newSim(rt)
			for _, w := range wants {
				s.add(&events.Want{Modules: w.Modules})
			}
			var account string
			var rows []events.PlanModule
			plan := uint64(0)
			for i := range settledBefore {
				s.add(&events.Settle{Module: "app", Op: events.OpApply, Plan: s.plans()[i]})
				p := s.plan(s.plans()[i])
				account, rows, plan = p.ProvisionerAccount, p.Modules, s.plans()[i]
			}
			_, reason := reconcile.Judge(account, rows, "app", path, writer)
			if reason == "" {
				reason = events.ReasonUndeclared // a write the node refused anyway, say a stale client's
			}
			ref := &events.Refusal{Module: "app", Path: path, Reason: reason, Plan: plan, Writer: writer}
			waive := &events.Waive{Module: "app", Path: path, By: "ops"}
			if waiveFirst {
				s.add(waive)
				s.add(ref)
			} else {
				s.add(ref)
				s.add(waive)
			}
			for i := settledBefore; i < nw; i++ {
				s.add(&events.Settle{Module: "app", Op: events.OpApply, Plan: s.plans()[i]})
				s.add(&events.Have{})
			}
			return s.owed(), s.knocked()
		}
		for _, first := range []bool{true, false} {
			owed, knocked := run(first)
			for _, o := range owed {
				if o.Path == path {
					rt.Fatalf("waive first=%v: %v still owed", first, o)
				}
			}
			for o := range knocked {
				if o.Path == path {
					rt.Fatalf("waive first=%v: %v knocked", first, o)
				}
			}
		}
	})
}

// TestRetireSettles is the retire rule of DESIGN.md §9 over random
// histories: after a retire nothing is owed and the last plan has no row;
// the node is retired exactly when, past the retire, every plan emitted
// has settled (or at once when forced), and a want brings it back.
func TestRetireSettles(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := newSim(rt)
		randomHistory(rt, s, rapid.IntRange(1, 40).Draw(rt, "events"))
		force := rapid.Bool().Draw(rt, "force")
		// A node retired already stays so (a forced retire may have come
		// before the plans it emptied settled).
		force = force || (s.state.Retire != nil && s.state.Retire.Retired)
		s.add(&events.Retire{By: "ops", Force: force})
		st := s.state
		if st.Retire == nil || len(st.Owed) != 0 {
			rt.Fatalf("after retire: %+v, %d owed", st.Retire, len(st.Owed))
		}
		if e := st.Emitted(); e != nil && len(e.Modules) != 0 {
			rt.Fatalf("after retire the last plan has %d rows", len(e.Modules))
		}
		if force && !st.Retire.Retired {
			rt.Fatal("a forced retire did not retire at once")
		}
		for _, p := range slices.Clone(st.Unsettled) {
			if st.Retire.Retired && !force {
				rt.Fatalf("retired with plan %d unsettled", p.Seq)
			}
			s.add(&events.Settle{Module: "", Op: events.OpApply, Plan: p.Seq})
		}
		if !st.Retire.Retired {
			rt.Fatalf("every plan settled and not retired: %+v", st.Retire)
		}
		s.add(&events.Want{Modules: []events.WantModule{{Name: "app", Build: "b1"}}})
		// A paused node takes the want in but emits its plan only on resume.
		rows := 1
		if st.Paused != nil {
			rows = 0
		}
		got := 0
		if e := st.Emitted(); e != nil {
			got = len(e.Modules)
		}
		if st.Retire != nil || got != rows {
			rt.Fatalf("a want did not bring the node back (paused %v): %+v, %d rows", st.Paused != nil, st.Retire, got)
		}
	})
}

// TestGateHoldsAgainstTheController is the gate of DESIGN.md §4 over
// random histories (a fresh user's finding M7): a module a want of this
// build (events.Want.Gates) ever marked requires_approval, or an operator
// gated, with no operator's lift since, is never composed at a new build
// without an approval of that build, whatever the wants after it say,
// an older build's wants (no "gates", which the controller may publish)
// among them. Only a plan that differs from the last one emitted is a
// composition (an agent that lost its plan gets the same plan again).
// The node's gates are exactly those: an older build's want never sets
// one (an upgrade changes no plan of a stream written before it), and
// nothing but an operator's lift takes one away.
func TestGateHoldsAgainstTheController(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) { gatesHold(rt, 0) })
}

// TestFullGatesFailClosed: a controller fills the node's gates with
// modules of no use, to MaxGates or to one or two short of it, before
// the random history of TestGateHoldsAgainstTheController: a module
// whose gate then finds no room still never moves to a new build
// without an approval, whatever later wants leave out (the fold's gates
// are full, State.GatesFull, and hold every module).
func TestFullGatesFailClosed(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) { gatesHold(rt, reconcile.MaxGates-rapid.IntRange(0, 2).Draw(rt, "room")) })
}

// gatesHold checks that no module the controller's wants or an operator
// gated (as a model with no cap has it) is composed at a new build
// without an approval, over junk gates of no use and a random history.
// With no junk the node's gates are exactly the model's.
func gatesHold(rt *rapid.T, junk int) {
	s := newSim(rt)
	for i := 0; i < junk; i += events.MaxModules {
		w := &events.Want{}
		for j := i; j < min(i+events.MaxModules, junk); j++ {
			w.Modules = append(w.Modules, events.WantModule{Name: fmt.Sprintf("junk%02d", j), Build: "b1", RequiresApproval: true})
		}
		s.add(w)
	}
	randomHistory(rt, s, rapid.IntRange(1, 80).Draw(rt, "events"))
	st := reconcile.NewState("ace")
	gated := map[string]bool{}
	approved := map[[2]string]bool{}
	flagged := map[string]bool{} // by the newest want
	for _, ev := range s.Events {
		var before []events.PlanModule
		if e := st.Emitted(); e != nil {
			before = slices.Clone(e.Modules)
		}
		effs := st.Fold(ev)
		switch p := ev.Payload.(type) {
		case *events.Want:
			clear(flagged)
			for _, m := range p.Modules {
				if m.RequiresApproval {
					flagged[m.Name] = true
					gated[m.Name] = gated[m.Name] || p.Gates
				}
			}
		case *events.Gate:
			gated[p.Module] = !p.Lift
		case *events.Approve:
			approved[[2]string{p.Module, p.Build}] = true
		case *events.Revoke:
			delete(approved, [2]string{p.Module, p.Build})
		}
		for _, e := range effs {
			pl, ok := e.Payload.(*events.Plan)
			if !ok || reflect.DeepEqual(pl.Modules, before) {
				continue
			}
			for _, row := range pl.Modules {
				runs, _ := st.Runs(row.Name)
				if !row.Held && (gated[row.Name] || flagged[row.Name]) && row.Build != runs.Build && !approved[[2]string{row.Name, row.Build}] {
					rt.Fatalf("#%d %s: %s composed at %s (what runs: %q) with no approval while gated", ev.Seq, ev.Kind, row.Name, row.Build, runs.Build)
				}
			}
		}
		var want, got []string
		for m, g := range gated {
			if g {
				want = append(want, m)
			}
		}
		for _, g := range st.Gates {
			got = append(got, g.Module)
		}
		slices.Sort(want)
		if junk == 0 && !slices.Equal(got, want) {
			rt.Fatalf("#%d %s: gates %v, want %v", ev.Seq, ev.Kind, got, want)
		}
	}
}
