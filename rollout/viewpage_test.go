package rollout_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
)

// The counts line names every status a target has, most pressing first,
// and adds up to the targets (a fresh user's finding M7: 300 rows and no
// count).
func TestCountsText(t *testing.T) {
	v := rollout.View{Counts: map[rollout.Status]int{rollout.Done: 142, rollout.Pending: 136, rollout.Changing: 20, rollout.Failed: 2}}
	if got, want := v.CountsText(), "300 targets: 2 failed, 20 changing, 136 pending, 142 done"; got != want {
		t.Errorf("CountsText = %q, want %q", got, want)
	}
	if got := (rollout.View{}).CountsText(); got != "0 targets" {
		t.Errorf("no target: %q", got)
	}
	if got := (rollout.View{Counts: map[rollout.Status]int{rollout.Done: 1}}).CountsText(); got != "1 target: 1 done" {
		t.Errorf("one target: %q", got)
	}
}

// Most pressing first: by status, an away target before one that is
// not, then the rollout's order.
func TestSortPressing(t *testing.T) {
	ts := []rollout.TargetView{
		{Node: "a", Status: rollout.Done},
		{Node: "b", Status: rollout.Pending},
		{Node: "c", Status: rollout.Changing},
		{Node: "d", Status: rollout.Failed},
		{Node: "e", Status: rollout.Changing, Down: true},
		{Node: "f", Status: rollout.Pending},
	}
	rollout.SortPressing(ts)
	var got []string
	for _, tv := range ts {
		got = append(got, tv.Node)
	}
	if want := []string{"d", "e", "c", "b", "f", "a"}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
}

func TestParseStatuses(t *testing.T) {
	got, err := rollout.ParseStatuses("failed, changing,failed")
	if err != nil || !slices.Equal(got, []rollout.Status{rollout.Failed, rollout.Changing}) {
		t.Errorf("ParseStatuses = %v, %v", got, err)
	}
	if _, err := rollout.ParseStatuses("broken"); !errors.Is(err, rollout.ErrBadStatus) {
		t.Errorf("ParseStatuses(broken) = %v, want ErrBadStatus", err)
	}
}

// A build that is failing on some nodes is listed with them, not left
// out (a fresh user's finding, fresh12 M2: a halted rollout's bad build,
// crash-looping on 3 nodes, was counted nowhere).
func TestBuildCountText(t *testing.T) {
	b := rollout.BuildCount{Module: "web", Build: "sha256:d23132", Nodes: 0, NotRunning: map[events.RunState]int{events.Failed: 3}}
	if got, want := b.Text(), "web@sha256:d23132 on 0 nodes, not running on 3: 3 failed"; got != want {
		t.Errorf("Text = %q, want %q", got, want)
	}
	b = rollout.BuildCount{Module: "web", Build: "b1", Nodes: 5}
	if got, want := b.Text(), "web@b1 on 5 nodes"; got != want {
		t.Errorf("Text = %q, want %q", got, want)
	}
}
