package node

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/meshfold/meshfold/events"
)

// checkFiles: a file in place when the agent first looks with a settled
// plan is taken note of, even when no have did so first (an agent
// restarted while its modules ran publishes its first have before its
// plan settles); deleted afterwards, the look finds it gone and the next
// have reports it, once; a fill (heldFile) makes it looked at again.
// A file missing at the first look was never in place: never reported.
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
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	a := &Agent{root: root, lookAll: true, log: slog.New(slog.DiscardHandler),
		settled: &events.Plan{Modules: []events.PlanModule{{Name: "app", Build: "a:1", RunsAs: "app",
			Files: []events.File{{Path: "/run/app/token", Mode: "0600"}, {Path: "/run/app/other", Mode: "0600"}}}}}}
	running := []events.HaveModule{{Name: "app", Build: "a:1", State: events.Running}}
	token := events.MissingFile{Module: "app", Path: "/run/app/token"}

	if a.checkFiles() {
		t.Fatal("the first look (taking note) found a file gone")
	}
	if err := root.Remove("run/app/token"); err != nil {
		t.Fatal(err)
	}
	if !a.checkFiles() {
		t.Fatal("a file in place at the first look, then deleted, is not found gone")
	}
	if got := a.missingFiles(running); !slices.Equal(got, []events.MissingFile{token}) {
		t.Fatalf("the have after the look reports %v, want only %v (other was never in place)", got, token)
	}
	if a.checkFiles() {
		t.Error("a file reported missing is looked at again by the check: one have per interval")
	}
	if got := a.missingFiles(running); !slices.Equal(got, []events.MissingFile{token}) {
		t.Fatalf("a later have reports %v, want %v until it is back", got, token)
	}
	// Refilled, then deleted again before any have: seen again.
	if err := root.WriteFile("run/app/token", []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	a.heldFile(fileRef{"app", "/run/app/token"})
	a.mu.Unlock()
	if err := root.Remove("run/app/token"); err != nil {
		t.Fatal(err)
	}
	if !a.checkFiles() {
		t.Fatal("a file refilled and deleted again before any have is not found gone")
	}
}
