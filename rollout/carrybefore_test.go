package rollout_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
)

// TestStartCarriesEveryWantBefore: the start carries the want each target
// had before the rollout (Had, HadSeq = Prev), each distinct want once, so
// that a revert gives it back from the start (RevertTo 0) rather than
// copying it from a stream whose --max-age may drop it during the
// rollout. A new node carries nothing (a revert gives it an empty want),
// nor does a node that is no target, nor one whose want did not decode
// (Current nil: never carried as an empty want).
func TestStartCarriesEveryWantBefore(t *testing.T) {
	old := []events.WantModule{{Name: "web", Build: "web:1"}}
	other := []events.WantModule{{Name: "web", Build: "web:0"}}
	want := []events.WantModule{{Name: "web", Build: "web:2"}}
	cands := []rollout.Candidate{
		{Node: "ace", Want: want, Prev: 11, Current: old},
		{Node: "bob", Want: want, Prev: 12, Current: old},
		{Node: "cat", Want: want, Prev: 13, Current: other},
		{Node: "dan", Want: want},                                           // new
		{Node: "eve", Want: want, Prev: 15, Current: want},                  // no target
		{Node: "fay", Want: want, Prev: 16},                                 // its want did not decode
		{Node: "gus", Want: want, Prev: 17, Current: []events.WantModule{}}, // a want of no module
	}
	start, pages := rollout.NewStart("ops", "", rollout.Params{}, cands)
	if len(pages) != 0 {
		t.Fatalf("%d pages", len(pages))
	}
	if err := rollout.Stamp(start, base).Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if len(start.Wants) != 4 {
		t.Fatalf("wants %v: want 4 (web:2, web:1 once, web:0, none)", start.Wants)
	}
	for i, c := range cands {
		n := start.Nodes[i]
		carried := c.Target() && c.Prev != 0 && c.Current != nil
		if !carried {
			if n.Had != 0 || n.HadSeq != 0 || n.RevertTo() != n.Prev {
				t.Errorf("%s carries had %d (#%d), revert-to #%d; want nothing carried", n.Node, n.Had, n.HadSeq, n.RevertTo())
			}
			continue
		}
		if n.Had == 0 || n.HadSeq != c.Prev || n.RevertTo() != 0 || !rollout.EqualWant(start.Wants[n.Had-1], c.Current) {
			t.Errorf("%s carries had %d (#%d), revert-to #%d; want its want #%d %v carried", n.Node, n.Had, n.HadSeq, n.RevertTo(), c.Prev, c.Current)
		}
	}
	if start.Nodes[0].Had != start.Nodes[1].Had {
		t.Errorf("ace and bob had the same want: had %d and %d", start.Nodes[0].Had, start.Nodes[1].Had)
	}
}

// TestStartCarriesWithinItsBound: a fleet whose targets had many distinct
// large wants carries as many as keep the start within rollout.MaxWants
// wants and it and each page within rollout.CarryBytes; the others
// revert by copy (RevertTo is Prev), and the start still validates. A
// page's nodes carry wants the start holds.
func TestStartCarriesWithinItsBound(t *testing.T) {
	files := func(i int) []events.File {
		var fs []events.File
		for j := range events.MaxFilesPerModule {
			fs = append(fs, events.File{Path: fmt.Sprintf("/run/app%d/%s/secret-%03d", i, strings.Repeat("d", 60), j), Mode: "0600"})
		}
		return fs
	}
	want := []events.WantModule{{Name: "web", Build: "web:2"}}
	var cands []rollout.Candidate
	const nodes = rollout.MaxNodesPerEvent + 700
	for i := range nodes {
		name := fmt.Sprintf("n%05d-%s", i, strings.Repeat("x", events.MaxName-7))
		// 300 distinct large wants, each had by several nodes.
		cur := []events.WantModule{{Name: "web", Build: fmt.Sprintf("web:1-%03d", i%300), Files: files(i % 300)}}
		cands = append(cands, rollout.Candidate{Node: name, Want: want, Prev: uint64(1000 + i), Current: cur,
			Restarts: []rollout.ModuleRestarts{{Module: "web", Build: "web:2", Restarts: 1}}})
	}
	start, pages := rollout.NewStart("ops", "", rollout.Params{}, cands)
	if err := rollout.Stamp(start, base).Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if len(start.Wants) > rollout.MaxWants {
		t.Fatalf("%d wants, over MaxWants %d", len(start.Wants), rollout.MaxWants)
	}
	size := func(v any) int {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return len(b)
	}
	if n := size(start); n > rollout.CarryBytes {
		t.Fatalf("start: %d bytes, over CarryBytes %d", n, rollout.CarryBytes)
	}
	carried, left := 0, 0
	count := func(list []rollout.NodeAtStart) {
		for _, n := range list {
			switch {
			case n.Had != 0:
				carried++
				if n.Had > len(start.Wants) || n.HadSeq != n.Prev {
					t.Fatalf("%s: had %d of %d wants (#%d, prev #%d)", n.Node, n.Had, len(start.Wants), n.HadSeq, n.Prev)
				}
			case n.RevertTo() == n.Prev:
				left++
			}
		}
	}
	count(start.Nodes)
	for i, p := range pages {
		page := &rollout.Nodes{Rollout: 1, Page: i + 1, Nodes: p}
		if n := size(page); n > rollout.CarryBytes {
			t.Fatalf("page %d: %d bytes, over CarryBytes %d", i+1, n, rollout.CarryBytes)
		}
		if err := rollout.Stamp(page, base).Validate(); err != nil {
			t.Fatalf("page %d: %v", i+1, err)
		}
		count(p)
	}
	if carried == 0 || left == 0 || carried+left != nodes {
		t.Fatalf("%d carried, %d left to a copy, of %d: want some of each", carried, left, nodes)
	}
	t.Logf("%d of %d targets carried in %d wants (%d bytes of start)", carried, nodes, len(start.Wants), size(start))
}
