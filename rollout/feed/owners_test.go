package feed_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/rollout/fleetfile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// Owners reads the newest rollout of each other fleet, its pages
// included: a node only a page names is owned; a node only an older
// rollout of the fleet named is not; the asking fleet owns nothing.
func TestOwners(t *testing.T) {
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subj := cfg.Subjects()
	start := func(fleet string, nodes ...string) {
		t.Helper()
		var cands []rollout.Candidate
		for _, n := range nodes {
			cands = append(cands, rollout.Candidate{Node: n, Want: []events.WantModule{{Name: "web", Build: "web:1"}}})
		}
		st, pages := rollout.NewStart("alice", "", rollout.Params{}, cands)
		// The fleet's newest start, as NewPlan reads it first.
		after, err := feed.NewestStart(ctx, stream, subj, fleet)
		if err != nil && !errors.Is(err, feed.ErrNoRollout) {
			t.Fatal(err)
		}
		p := &feed.Plan{Fleet: &fleetfile.Fleet{Name: fleet}, Cands: cands, Start: st, Pages: pages, After: after}
		if _, err := p.Apply(ctx, js, subj); err != nil {
			t.Fatal(err)
		}
	}
	var big []string
	for i := range rollout.MaxNodesPerEvent + 1 {
		big = append(big, fmt.Sprintf("n%05d", i))
	}
	last := big[len(big)-1] // on the start's second page
	start("old", "ace", "bob")
	start("web", big...)
	start("old", "bob") // old's newest rollout no longer names ace
	start("api", "cat")

	got, err := feed.Owners(ctx, stream, subj, "api", []string{"ace", "bob", "cat", "n00000", last, "zed"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"bob": "old", "n00000": "web", last: "web"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Owners = %v, want %v", got, want)
	}
	if got, err := feed.Owners(ctx, stream, subj, "web", big); err != nil || got != nil {
		t.Fatalf("a fleet's own nodes: Owners = %v, %v", got, err)
	}
}
