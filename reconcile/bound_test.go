package reconcile_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"pgregory.net/rapid"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// pathRound plays one round of path changes on s: a want that declares a
// new file for app under one of three provisioner accounts and moves
// nats (which requires approval) to a new build every third round, with
// its approval; a refusal of the new file judged by the previous plan
// (incident 1), the new plan's settle, which knocks it, a fill of the new
// file, and a have.
func pathRound(s *sim, r int) {
	account := []string{"prov", "prov2", "prov3"}[r%3]
	build := fmt.Sprintf("n:%d", r/3)
	path := fmt.Sprintf("/etc/app/%d", r)
	if r%3 == 0 {
		s.add(&events.Approve{Module: "nats", Build: build, By: "ops"})
	}
	s.add(&events.Want{Modules: []events.WantModule{
		{Name: "provisioner", Build: "p:1", RunsAs: account, Provisioner: true},
		{Name: "app", Build: "a:1", RunsAs: "app", Files: []events.File{{Path: path, Mode: "0600"}, {Path: "/etc/app/fixed", Mode: "0600"}}},
		{Name: "nats", Build: build, RunsAs: "nats", RequiresApproval: true},
	}})
	plan := s.plans()[len(s.plans())-1]
	var prev uint64
	if len(s.plans()) > 1 {
		prev = s.plans()[len(s.plans())-2]
	}
	s.add(&events.Refusal{Module: "app", Path: path, Reason: events.ReasonUndeclared, Plan: prev, Writer: account})
	s.add(&events.Settle{Module: "app", Op: events.OpApply, Plan: plan})
	s.add(&events.Filled{Module: "app", Path: path, Plan: plan, Digest: "d"})
	s.add(&events.Have{Modules: []events.HaveModule{
		{Name: "provisioner", Build: "p:1", State: events.Running, Account: account},
		{Name: "app", Build: "a:1", State: events.Running, Account: "app"},
		{Name: "nats", Build: build, State: events.Running, Account: "nats"},
	}})
}

// maxBoundedState is the size this test states for the state of a node
// whose wants keep changing paths, accounts and approved builds: its
// accepting records, filled marks and approvals at their caps (limits.go),
// the rest one round's worth.
const maxBoundedState = 40 << 10

// TestStateBoundedUnderPathChanges: 10,000 rounds of wants that change
// paths, accounts and approved builds leave a state no larger than
// maxBoundedState, and no larger than after 1,000 rounds but for longer
// numbers: its records reach their caps and stay there (DESIGN.md §4,
// "Bounded by counts"). Before any bound it grew with every round (106 KB
// after 420 rounds, issue 13); while the state forgot what the want no
// longer named (issue 29) it held 2,040 bytes.
func TestStateBoundedUnderPathChanges(t *testing.T) {
	const rounds = 10_000
	s := newSim(t)
	// Every tenth round is measured and checked: its records are at their
	// caps as much as any round's, and checking every fold of 10,000
	// rounds took minutes under the race detector.
	s.Live = nil
	var largest, at1000 int
	var largestAt int
	for r := range rounds {
		pathRound(s, r)
		if r%10 != 9 {
			continue
		}
		if err := s.state.CheckInvariants(); err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
		b, err := json.Marshal(s.state)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > largest {
			largest, largestAt = len(b), r
		}
		if r == 999 {
			at1000 = largest
		}
		if r%1000 == 999 {
			s.Trim() // the stream grows; only the sim's memory holds it
		}
	}
	st := s.state
	t.Logf("after %d rounds: largest state %d bytes (round %d; %d after 1,000 rounds): %d accepting, %d filled, %d approvals, %d owed",
		rounds, largest, largestAt, at1000, len(st.Accepting), len(st.Filled), len(st.Approvals), len(st.Owed))
	if largest > maxBoundedState {
		t.Fatalf("the state reached %d bytes, above the %d stated", largest, maxBoundedState)
	}
	// Only the digits of sequences and paths grow.
	if largest > at1000+at1000/10 {
		t.Fatalf("the state grew from %d bytes after 1,000 rounds to %d", at1000, largest)
	}
	if len(st.Accepting) != reconcile.MaxAccepting || len(st.Filled) != reconcile.MaxFilled || len(st.Approvals) != reconcile.MaxModuleApprovals {
		t.Fatalf("records not at their caps: %d accepting, %d filled, %d approvals", len(st.Accepting), len(st.Filled), len(st.Approvals))
	}
}

// exceeds reports whether st holds more records of a kind than c allows.
func exceeds(st *reconcile.State, c reconcile.Caps) bool {
	perModule := map[string]int{}
	most := 0
	for _, a := range st.Approvals {
		perModule[a.Module]++
		most = max(most, perModule[a.Module])
	}
	return len(st.Unsettled) > c.Unsettled || len(st.Owed) > c.Owed || len(st.Approvals) > c.Approvals ||
		most > c.ModuleApprovals || len(st.Accepting) > c.Accepting || len(st.Filled) > c.Filled || len(st.Waivers) > c.Waivers
}

// records are the keys of a state's records that DESIGN.md §4 says are
// dropped only past their caps: approvals (module, build), accepting
// records (module, path, account) and filled marks (module, path).
type records struct{ approvals, accepting, filled map[string]bool }

func recordsOf(st *reconcile.State) records {
	r := records{map[string]bool{}, map[string]bool{}, map[string]bool{}}
	for _, a := range st.Approvals {
		r.approvals[a.Module+" "+a.Build] = true
	}
	for _, a := range st.Accepting {
		r.accepting[a.Module+" "+a.Path+" "+a.Account] = true
	}
	for _, m := range st.Filled {
		r.filled[m.Module+" "+m.Path] = true
	}
	return r
}

// lostIn names a record of r that after lacks, but for the approval a
// revoke takes back; "" when none.
func (r records) lostIn(after records, ev events.Event) string {
	revoked := ""
	if p, ok := ev.Payload.(*events.Revoke); ok {
		revoked = p.Module + " " + p.Build
	}
	for _, kind := range []struct {
		name          string
		before, after map[string]bool
	}{{"the approval", r.approvals, after.approvals}, {"the accepting record", r.accepting, after.accepting}, {"the filled mark", r.filled, after.filled}} {
		for k := range kind.before {
			if !kind.after[k] && !(kind.name == "the approval" && k == revoked) {
				return kind.name + " " + k
			}
		}
	}
	return ""
}

// TestBoundedFoldEqualsUnbounded is DESIGN.md §4's promise that ordinary
// histories fold exactly as its rules say: for any history whose unbounded
// fold never holds more records of a kind than that kind's cap (its
// configuration changes fewer times than the caps), the bounded fold
// makes the same effects, with the same ids, the same owed set and the
// same state. Half the cases fold under the caps of limits.go, half under
// small caps drawn at random, so that histories come near them. The
// unbounded fold itself never drops an approval (but by a revoke), an
// accepting record or a filled mark: a rule that forgets one, which the
// bounded and the unbounded fold would share, fails here too (issue 29).
func TestBoundedFoldEqualsUnbounded(t *testing.T) {
	var cases, compared, small int
	rapid.Check(t, func(rt *rapid.T) {
		cases++
		c := reconcile.Caps{Unsettled: reconcile.MaxUnsettled, Owed: reconcile.MaxOwed, Approvals: reconcile.MaxApprovals,
			ModuleApprovals: reconcile.MaxModuleApprovals, Accepting: reconcile.MaxAccepting, Filled: reconcile.MaxFilled, Waivers: reconcile.MaxWaivers}
		isSmall := rapid.Bool().Draw(rt, "small caps")
		if isSmall {
			c = reconcile.Caps{
				Unsettled:       rapid.IntRange(2, 6).Draw(rt, "unsettled"),
				Owed:            rapid.IntRange(1, 12).Draw(rt, "owed"),
				Approvals:       rapid.IntRange(1, 8).Draw(rt, "approvals"),
				ModuleApprovals: rapid.IntRange(1, 4).Draw(rt, "module approvals"),
				Accepting:       rapid.IntRange(1, 24).Draw(rt, "accepting"),
				Filled:          rapid.IntRange(1, 12).Draw(rt, "filled"),
				Waivers:         rapid.IntRange(1, 4).Draw(rt, "waivers"),
			}
		}
		unbounded := newSimOf(rt, func(node string) *reconcile.State { return reconcile.NewStateCapped(node, reconcile.Caps{}) })
		within := true
		check := unbounded.Live
		var before records
		unbounded.Live = func(ev events.Event, st *reconcile.State) {
			check(ev, st)
			within = within && !exceeds(st, c)
			after := recordsOf(st)
			if lost := before.lostIn(after, ev); lost != "" {
				rt.Fatalf("#%d %s: the unbounded fold forgot %s", ev.Seq, ev.Kind, lost)
			}
			before = after
		}
		randomHistory(rt, unbounded, rapid.IntRange(1, 60).Draw(rt, "events"))
		if !within {
			return
		}
		compared++
		if isSmall {
			small++
		}
		// The bounded fold of the same stream: if it makes the same effects
		// at every event, it would have written the same stream.
		bounded := reconcile.NewStateCapped("ace", c)
		for _, ev := range unbounded.Events {
			got, want := bounded.Fold(ev), unbounded.Effects(ev.Seq)
			if err := bounded.CheckInvariants(); err != nil {
				rt.Fatalf("bounded, after #%d: %v", ev.Seq, err)
			}
			if len(got) != len(want) {
				rt.Fatalf("#%d %s: %d effects bounded, %d unbounded", ev.Seq, ev.Kind, len(got), len(want))
			}
			for i := range got {
				if got[i].ID() != want[i].ID() || encode(rt, got[i].Payload) != encode(rt, want[i].Payload) {
					rt.Fatalf("#%d: effect %s %s bounded, %s %s unbounded", ev.Seq, got[i].ID(), encode(rt, got[i].Payload), want[i].ID(), encode(rt, want[i].Payload))
				}
			}
		}
		if got, want := encode(rt, bounded.Owed), encode(rt, unbounded.state.Owed); got != want {
			rt.Fatalf("owed bounded %s, unbounded %s", got, want)
		}
		if got, want := encode(rt, bounded), encode(rt, unbounded.state); got != want {
			rt.Fatalf("state bounded:\n%s\nunbounded:\n%s", got, want)
		}
	})
	t.Logf("%d cases: %d below the caps compared (%d of them under small caps)", cases, compared, small)
	if compared < cases/4 {
		t.Fatalf("only %d of %d cases stayed below the caps: the property tests little", compared, cases)
	}
}
