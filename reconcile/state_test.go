package reconcile_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// operatorState folds a history that sets every field the operator events
// of DESIGN.md §9 add: a pause, waivers, placements, an item with its time,
// then a retire.
func operatorState(t *testing.T, retire bool) *reconcile.State {
	s := newSim(t)
	s.add(want("prov", "/a", "/b"))
	s.add(&events.Settle{Module: "app", Op: events.OpApply, Plan: s.plans()[0]})
	s.add(&events.Refusal{Module: "app", Path: "/c", Reason: events.ReasonUndeclared, Plan: s.plans()[0], Writer: "prov"})
	s.add(&events.Waive{Module: "app", Path: "/b", By: "ops"})
	s.add(&events.Pause{By: "ops", Reason: "disk swap"})
	if retire {
		s.add(&events.Retire{By: "ops"})
	}
	return s.state
}

// TestSnapshotRoundTripOperatorFields: a state holding every §9 field
// survives the snapshot format unchanged, invariants checked.
func TestSnapshotRoundTripOperatorFields(t *testing.T) {
	for _, retire := range []bool{false, true} {
		st := operatorState(t, retire)
		b, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		for _, field := range []string{`"waivers"`, `"placed"`} {
			if !strings.Contains(string(b), field) {
				t.Errorf("snapshot lacks %s: %s", field, b)
			}
		}
		if retire != strings.Contains(string(b), `"retire"`) || retire == strings.Contains(string(b), `"paused"`) {
			t.Errorf("retire=%v: snapshot %s", retire, b)
		}
		back, err := reconcile.UnmarshalState(b)
		if err != nil {
			t.Fatal(err)
		}
		if b2, _ := json.Marshal(back); string(b2) != string(b) {
			t.Errorf("round trip:\n%s\n%s", b, b2)
		}
	}
}

// TestInvariantsOfOperatorFields: CheckInvariants catches each broken
// invariant of the §9 fields.
func TestInvariantsOfOperatorFields(t *testing.T) {
	for name, breakIt := range map[string]func(s *reconcile.State){
		"retiring node owes": func(s *reconcile.State) {
			s.Owed = append(s.Owed, reconcile.Item{Owed: events.Owed{Module: "app", Path: "/z", Reason: events.ReasonUndeclared, Writer: "w"}})
		},
		"retiring node's plan has rows": func(s *reconcile.State) {
			s.Retire.Seq = s.Seq
			s.Unsettled = nil
			s.Settled.Modules = []events.PlanModule{{Name: "app", Build: "a"}}
		},
		"retired without a sequence":       func(s *reconcile.State) { s.Retire.Retired = true },
		"retire after the folded sequence": func(s *reconcile.State) { s.Retire.Seq = s.Seq + 1 },
		"waivers unsorted": func(s *reconcile.State) {
			s.Waivers = append(s.Waivers, reconcile.Waiver{Module: "a", Path: "/a"})
		},
		"placement above the settled plan": func(s *reconcile.State) { s.Placed[0].Plan = s.Settled.Seq + 1 },
		"placements unsorted": func(s *reconcile.State) {
			s.Placed = append(s.Placed, reconcile.Placement{Module: "a", Plan: 1, Time: time.Unix(0, 0)})
		},
	} {
		t.Run(name, func(t *testing.T) {
			st := operatorState(t, true)
			if err := st.CheckInvariants(); err != nil {
				t.Fatalf("before: %v", err)
			}
			breakIt(st)
			if err := st.CheckInvariants(); err == nil {
				t.Fatal("CheckInvariants passed a broken state")
			}
			b, _ := json.Marshal(st)
			if _, err := reconcile.UnmarshalState(b); err == nil {
				t.Fatal("UnmarshalState took a broken snapshot")
			}
		})
	}
	st := operatorState(t, false)
	st.Paused.Seq = st.Seq + 1
	if err := st.CheckInvariants(); err == nil {
		t.Fatal("a pause after the folded sequence passed")
	}
}

// A snapshot from before placements were recorded: the next settle places
// its files at no known plan, so a fill from before counts and a file
// never filled is still said to be unfilled.
func TestPlacementFromOlderSnapshot(t *testing.T) {
	s := newSim(t)
	s.add(want("prov", "/a", "/b"))
	s.add(&events.Settle{Module: "app", Op: events.OpApply, Plan: s.plans()[0]})
	s.add(&events.Filled{Module: "app", Path: "/a", Plan: s.plans()[0], Digest: "d"})
	s.state.Placed = nil // as a snapshot of an older build decodes
	w := want("prov", "/a", "/b")
	w.Modules[1].Build = "a:2"
	s.add(w)
	s.add(&events.Settle{Module: "app", Op: events.OpApply, Plan: s.plans()[1]})
	got := s.state.View().Unfilled
	if len(got) != 1 || got[0].Path != "/b" || got[0].Plan != 0 || !got[0].Since.IsZero() {
		t.Fatalf("unfilled %+v, want /b only, at no known plan", got)
	}
	if k := s.state.View().Stuck(base.Add(time.Hour)); len(k.Unfilled) != 1 {
		t.Errorf("stuck %+v", k)
	}
}

// A snapshot written before crash records named their build (F2) holds
// them with Build "": they are the newest have's build's, kept while the
// module runs at it and dropped when it runs another.
func TestCrashesOfASnapshotWithoutBuild(t *testing.T) {
	at := func(build string, restarts int) *events.Have {
		return &events.Have{Modules: []events.HaveModule{{Name: "app", Build: build, State: events.Running, Restarts: restarts}}}
	}
	for _, tc := range []struct {
		build string
		want  int
	}{{"v:1", 3}, {"v:2", 0}} {
		s := newSim(t)
		for r := range 3 {
			s.add(at("v:1", r))
		}
		b, err := reconcile.MarshalState(s.state)
		if err != nil {
			t.Fatal(err)
		}
		old := strings.Replace(string(b), `{"module":"app","build":"v:1","times"`, `{"module":"app","times"`, 1)
		if old == string(b) {
			t.Fatalf("no crash record's build in %s", b)
		}
		st, err := reconcile.UnmarshalState([]byte(old))
		if err != nil {
			t.Fatal(err)
		}
		if rt := reconcile.RuntimeOf(st); len(rt[0].Crashes) != 2 {
			t.Fatalf("an old snapshot's runtime: %+v; want its 2 crashes", rt)
		}
		ev := events.Event{Seq: st.Seq + 1, Time: base.Add(time.Hour), Node: "ace", Kind: events.KindHave, Payload: events.Stamp(at(tc.build, 3), base.Add(time.Hour))}
		st.Fold(ev)
		if err := st.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
		if rt := reconcile.RuntimeOf(st); len(rt[0].Crashes) != tc.want {
			t.Errorf("a have at %s after an old snapshot's crashes of v:1: %d crashes, want %d", tc.build, len(rt[0].Crashes), tc.want)
		}
	}
}
