package rollout_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
)

// TestStartCarriesRestartsOfUnchangedModules: the start carries a
// target's restarts of the modules its new want leaves at their build,
// without the build, and none of a module the want changes (a fresh
// user's finding G6).
func TestStartCarriesRestartsOfUnchangedModules(t *testing.T) {
	cur := []events.WantModule{{Name: "app", Build: "a1"}, {Name: "web", Build: "w1"}}
	want := []events.WantModule{{Name: "app", Build: "a1"}, {Name: "web", Build: "w2"}}
	c := rollout.Candidate{Node: "ace", Prev: 4, Current: cur, Want: want,
		Restarts: []rollout.ModuleRestarts{{Module: "app", Build: "a1", Restarts: 7}, {Module: "web", Build: "w1", Restarts: 2}}}
	start, _ := rollout.NewStart("ops", "", rollout.Params{}, []rollout.Candidate{c})
	got := start.Nodes[0].Restarts
	if len(got) != 1 || got[0] != (rollout.ModuleRestarts{Module: "app", Restarts: 7}) {
		t.Fatalf("restarts carried = %+v, want app's 7 alone, without its build", got)
	}
}

// TestStartRestartsKeepAPageUnderTheEventBound: however many restarted
// modules the targets have, a full page of them stays under
// events.MaxEventBytes: each node's entry is kept within
// RestartsNodeBytes, the modules past it left out.
func TestStartRestartsKeepAPageUnderTheEventBound(t *testing.T) {
	var cands []rollout.Candidate
	for i := range rollout.MaxNodesPerEvent {
		var cur, want []events.WantModule
		var rs []rollout.ModuleRestarts
		for j := range 8 {
			name := fmt.Sprintf("module-%02d-%s", j, strings.Repeat("x", 40))
			cur = append(cur, events.WantModule{Name: name, Build: "sha256:" + strings.Repeat("a", 64)})
			rs = append(rs, rollout.ModuleRestarts{Module: name, Build: "sha256:" + strings.Repeat("a", 64), Restarts: 1_000_000})
		}
		want = append(append(want, cur...), events.WantModule{Name: "new", Build: "b"})
		cands = append(cands, rollout.Candidate{Node: fmt.Sprintf("n%05d", i), Prev: 1 << 40, Current: cur, Want: want, Restarts: rs})
	}
	start, _ := rollout.NewStart("ops", "", rollout.Params{}, cands)
	for _, n := range start.Nodes {
		b, err := json.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		if len(n.Restarts) > 0 && len(b) > rollout.RestartsNodeBytes {
			t.Fatalf("node %s's entry is %d bytes with %d restarts carried, over %d", n.Node, len(b), len(n.Restarts), rollout.RestartsNodeBytes)
		}
	}
	b, err := json.Marshal(start)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > events.MaxEventBytes {
		t.Fatalf("a start of %d nodes with restarts is %d bytes, over events.MaxEventBytes %d", len(start.Nodes), len(b), events.MaxEventBytes)
	}
}

// TestStartDownTargetKeepsItsRestarts: a target whose agent is down at
// apply, with an unhealthy module, keeps its restart counts in the start
// with its down_since, though its entry is then over RestartsNodeBytes:
// its page has room (fitRestarts). A fresh user's finding: a node
// recorded down at apply lost mesh-build-go's 7 restarts to the entry's
// bound, and its step failed for a crash loop 24 minutes old.
func TestStartDownTargetKeepsItsRestarts(t *testing.T) {
	cur := []events.WantModule{{Name: "app", Build: "a1"}, {Name: "mesh-build-go", Build: "g1"}}
	want := []events.WantModule{{Name: "app", Build: "a2"}, {Name: "mesh-build-go", Build: "g1"}}
	down := time.Date(2026, 12, 5, 8, 36, 48, 123456789, time.UTC)
	c := rollout.Candidate{Node: "n05", Prev: 1327, Current: cur, Want: want, Down: true, DownSince: down, Unhealthy: []string{"mesh-build-go"},
		Restarts: []rollout.ModuleRestarts{{Module: "mesh-build-go", Build: "g1", Restarts: 7}}}
	start, _ := rollout.NewStart("ops", "", rollout.Params{}, []rollout.Candidate{c})
	n := start.Nodes[0]
	if len(n.Restarts) != 1 || n.Restarts[0] != (rollout.ModuleRestarts{Module: "mesh-build-go", Restarts: 7}) {
		t.Fatalf("a down target's restarts carried = %+v, want mesh-build-go's 7", n.Restarts)
	}
	if !n.Down || !n.DownSince.Equal(down) {
		t.Errorf("down %v since %v: want down since %v", n.Down, n.DownSince, down)
	}
}
