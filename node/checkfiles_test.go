package node

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/saferoot"
)

// checkFiles: a file in place when the agent first looks with a settled
// plan is taken note of, even when no have did so first; deleted
// afterwards, the look finds it gone and the next have reports it, once;
// a fill (heldFile) makes it looked at again. A file missing at the first
// look (a reboot emptied /run) is gone at the agent's start: the first
// look says a have is due, and every have reports it marked so
// (events.MissingFile.AtStart) until it is back; once a fill wrote it, a
// deletion is reported as one in the agent's life.
func TestCheckFilesNotesThenFindsGone(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{"run/app/token", "run/app/other"} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "run/app/token"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	root, err := saferoot.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	a := &Agent{root: root, lookAll: true, log: slog.New(slog.DiscardHandler),
		settled: &events.Plan{Modules: []events.PlanModule{{Name: "app", Build: "a:1", RunsAs: "app",
			Files: []events.File{{Path: "/run/app/token", Mode: "0600"}, {Path: "/run/app/other", Mode: "0600"}}}}}}
	running := []events.HaveModule{{Name: "app", Build: "a:1", State: events.Running}}
	token := events.MissingFile{Module: "app", Path: "/run/app/token"}
	other := events.MissingFile{Module: "app", Path: "/run/app/other", AtStart: true}

	if !a.checkFiles() {
		t.Fatal("the first look found other gone (the agent's start) but asks no have")
	}
	if got := a.missingFiles(running); !slices.Equal(got, []events.MissingFile{other}) {
		t.Fatalf("the have after the first look reports %v, want only %v", got, other)
	}
	a.startReported()
	if a.checkFiles() {
		t.Fatal("a second look with nothing deleted since found a file gone")
	}
	if err := os.Remove(filepath.Join(dir, "run/app/token")); err != nil {
		t.Fatal(err)
	}
	if !a.checkFiles() {
		t.Fatal("a file in place at the first look, then deleted, is not found gone")
	}
	if got := a.missingFiles(running); !slices.Equal(got, []events.MissingFile{other, token}) {
		t.Fatalf("the have after the look reports %v, want %v (other gone at the start, token since)", got, []events.MissingFile{other, token})
	}
	if a.checkFiles() {
		t.Error("a file reported missing is looked at again by the check: one have per interval")
	}
	if got := a.missingFiles(running); !slices.Equal(got, []events.MissingFile{other, token}) {
		t.Fatalf("a later have reports %v, want %v until they are back", got, []events.MissingFile{other, token})
	}
	// Both filled: reported no more.
	for _, f := range []events.MissingFile{token, other} {
		if err := os.WriteFile(filepath.Join(dir, f.Path), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		a.mu.Lock()
		a.heldFile(fileRef{f.Module, f.Path})
		a.mu.Unlock()
	}
	if got := a.missingFiles(running); len(got) != 0 {
		t.Fatalf("the have after the fills reports %v, want none", got)
	}
	// Deleted again before any have: seen again, as deletions in the
	// agent's life (a fill of it wrote them), not gone at its start.
	for _, f := range []events.MissingFile{token, other} {
		if err := os.Remove(filepath.Join(dir, f.Path)); err != nil {
			t.Fatal(err)
		}
	}
	if !a.checkFiles() {
		t.Fatal("files refilled and deleted again before any have are not found gone")
	}
	if got, want := a.missingFiles(running), []events.MissingFile{{Module: "app", Path: "/run/app/other"}, token}; !slices.Equal(got, want) {
		t.Fatalf("the have after the second deletion reports %v, want %v", got, want)
	}
}

// A file gone at the agent's start that comes back by another hand than a
// fill of this agent (an operator's copy) is reported no more.
func TestStartGoneBackByHand(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "run/app"), 0o755); err != nil {
		t.Fatal(err)
	}
	root, err := saferoot.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	a := &Agent{root: root, lookAll: true, log: slog.New(slog.DiscardHandler),
		settled: &events.Plan{Modules: []events.PlanModule{{Name: "app", Build: "a:1", RunsAs: "app",
			Files: []events.File{{Path: "/run/app/token", Mode: "0600"}}}}}}
	running := []events.HaveModule{{Name: "app", Build: "a:1", State: events.Running}}
	gone := []events.MissingFile{{Module: "app", Path: "/run/app/token", AtStart: true}}
	if got := a.missingFiles(running); !slices.Equal(got, gone) {
		t.Fatalf("the first have reports %v, want the token gone at the start", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "run/app/token"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Back before the first have was stored: its retry says still what
	// the first look found; once stored, the file back is reported no
	// more.
	if got := a.missingFiles(running); !slices.Equal(got, gone) {
		t.Fatalf("the first have, built again, reports %v, want %v", got, gone)
	}
	a.startReported()
	if got := a.missingFiles(running); len(got) != 0 {
		t.Fatalf("a file back by hand is reported %v", got)
	}
	if err := os.Remove(filepath.Join(dir, "run/app/token")); err != nil {
		t.Fatal(err)
	}
	if !a.checkFiles() {
		t.Fatal("the file back by hand, then deleted, is not found gone")
	}
}
