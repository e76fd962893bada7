package main

import (
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// fleet's table ends with what the stream keeps, its retention: no
// meshfold command said it, and one group member's --max-age changed it
// for all (a fresh user's finding m4).
func TestFleetSaysWhatTheStreamKeeps(t *testing.T) {
	m := startMesh(t)
	m.serveSigned(t)
	w := &events.Want{Modules: []events.WantModule{{Name: "app", Build: "a:1", RunsAs: "app"}}}
	if _, err := store.NewPublisher(m.js, m.cfg.Subjects()).Append(testCtx(t), "ace", events.Stamp(w, time.Now())); err != nil {
		t.Fatal(err)
	}
	fleetSays := func(want string) {
		t.Helper()
		var out string
		waitUntil(t, testCtx(t), "fleet to list ace", func() bool {
			out, _, _ = m.cli(t, "fleet")
			return strings.Contains(out, "\nace ")
		})
		if !strings.Contains(out, "\n"+want+"\n") {
			t.Errorf("fleet does not say %q:\n%s", want, out)
		}
	}
	fleetSays("-- stream " + m.cfg.Name + " keeps all events")
	if _, _, err := store.EnsureStream(testCtx(t), m.js, store.StreamConfig{MaxAge: 2160 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	fleetSays("-- stream " + m.cfg.Name + " keeps 2160h0m0s of events (--max-age)")
}
