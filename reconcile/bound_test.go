package reconcile_test

import (
	"encoding/json"
	"fmt"
	"testing"

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
	var largest, at1000 int
	var largestAt int
	for r := range rounds {
		pathRound(s, r)
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
