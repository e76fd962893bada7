package audit

import (
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
)

// A have told against the one before it says what it adds, never
// "unchanged" when it adds something: a failed module that ran and failed
// again, with nothing else to tell it by, is "failed again" (a fresh
// user's finding m4: "unchanged" after every restart of a crash loop); a
// file newly reported missing leads the line, which the width cuts at
// its end (fresh12 m1: "have unchanged: …" for the have that reported
// it).
func TestHaveSummaryTellsWhatIsNew(t *testing.T) {
	t1 := time.Date(2026, 12, 5, 14, 27, 36, 0, time.UTC)
	t2 := t1.Add(time.Second)
	mod := func(since time.Time) events.HaveModule {
		return events.HaveModule{Name: "mesh-build-go", Build: "sha256:b1bc9cd29dd2", State: events.Failed, Account: "nobody",
			Restarts: 1, Exit: "status 1", Since: &since}
	}
	app := events.HaveModule{Name: "app", Build: "sha256:42a1e9ec2e0a", State: events.Running, Account: "nobody"}
	prev := &events.Have{Modules: []events.HaveModule{app, mod(t1)}}
	again := &events.Have{Modules: []events.HaveModule{app, mod(t2)}}
	if got, want := haveSummaryAfter(again, prev, 0), "mesh-build-go failed again since 14:27:37 (status 1)"; got != want {
		t.Errorf("a failed module failed again: %q, want %q", got, want)
	}
	if got := haveSummaryAfter(prev, prev, 0); !strings.HasPrefix(got, "unchanged: ") {
		t.Errorf("the same have again: %q, want unchanged", got)
	}
	gone := &events.Have{Modules: prev.Modules, Missing: []events.MissingFile{{Module: "app", Path: "/run/app/token"}}}
	got := haveSummaryAfter(gone, prev, 0)
	if want := "missing on the node: app /run/app/token"; got != want {
		t.Errorf("a have reporting a file gone, nothing else new: %q, want %q", got, want)
	}
	still := &events.Have{Modules: again.Modules, Missing: gone.Missing}
	if got, want := haveSummaryAfter(still, gone, 0), "mesh-build-go failed again since 14:27:37 (status 1); missing on the node: app /run/app/token"; got != want {
		t.Errorf("a file still missing: %q, want %q (the new first)", got, want)
	}
}
