package rollout_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
)

// TestNewFiles: the files a target waits for are those its new want adds
// to a module, not those its module declared before (a new build keeps
// them on disk), and the start carries each distinct list once.
func TestNewFiles(t *testing.T) {
	f := func(p string) []events.File { return []events.File{{Path: p, Mode: "0600"}} }
	old := []events.WantModule{{Name: "web", Build: "b1", Files: f("/run/web/key")}}
	want := []events.WantModule{{Name: "web", Build: "b2", Files: f("/run/web/key")}, {Name: "creds", Build: "c1", Files: f("/run/creds/token")}}
	got := rollout.NewFiles(old, want)
	if exp := []rollout.FileRef{{Module: "creds", Path: "/run/creds/token"}}; !slices.Equal(got, exp) {
		t.Fatalf("NewFiles = %v, want %v", got, exp)
	}
	if got := rollout.NewFiles(want, want); got != nil {
		t.Fatalf("NewFiles of an unchanged want = %v", got)
	}
	cands := []rollout.Candidate{
		{Node: "ace", Want: want, Prev: 1, Current: old},
		{Node: "bob", Want: want, Prev: 2, Current: old},
		{Node: "cat", Want: want, Prev: 3, Current: want},
	}
	start, _ := rollout.NewStart("ops", "", rollout.Params{}, cands)
	if len(start.NewFiles) != 1 || start.Nodes[0].NewFiles != 1 || start.Nodes[1].NewFiles != 1 || start.Nodes[2].NewFiles != 0 {
		t.Fatalf("start new_files %v, nodes %+v", start.NewFiles, start.Nodes)
	}
	if err := rollout.Stamp(start, base).Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	start.Nodes[0].NewFiles = 2
	if err := start.Validate(); !errors.Is(err, rollout.ErrFilesIndex) {
		t.Fatalf("Validate of a node naming no list: %v, want ErrFilesIndex", err)
	}
	start.Nodes[0].NewFiles = 1
	start.NewFiles[0][0].Path = "run/x"
	if err := start.Validate(); !errors.Is(err, events.ErrBadValue) {
		t.Fatalf("Validate of a relative path: %v, want ErrBadValue", err)
	}
}
