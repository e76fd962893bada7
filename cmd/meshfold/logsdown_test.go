package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// logs of a node whose agent the stream records down says so: since
// when and why, what the newest have said of the module, and where its
// output is meanwhile (a fresh user's finding m5: "no agent of node n10
// answered (is 'meshfold node n10' running?)" of an agent down for
// minutes, its module running on under its supervisor).
func TestLogsSaysTheAgentIsDown(t *testing.T) {
	m := startMesh(t)
	trust := m.serveSigned(t)
	w := &events.Want{Modules: []events.WantModule{{Name: "app", Build: "a:1", RunsAs: "app"}}}
	if _, err := store.NewPublisher(m.js, m.cfg.Subjects()).Append(testCtx(t), "ace", events.Stamp(w, time.Now())); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	stop, _ := m.background(t, trust, "node", "ace", "--runtime", "record", "--root", filepath.Join(dir, "root"),
		"--state-dir", filepath.Join(dir, "state"), "--log-level", "warn")
	stateSays := func(what string) {
		t.Helper()
		waitUntil(t, testCtx(t), "state to say "+what, func() bool {
			out, _, _ := m.cli(t, "state", "ace")
			return strings.Contains(strings.Join(strings.Fields(out), " "), what)
		})
	}
	stateSays("runs app a:1 running")
	stop()
	stateSays("agent DOWN since")

	_, stderr, code := m.cli(t, "logs", "ace", "app", "--timeout", "2s")
	for _, want := range []string{
		"node ace's agent is down since ", "agent stopped, lease released", "says app running",
		"start the agent ('meshfold node ace')", "<state-dir>/process/app/module.log", "/var/lib/meshfold/node-ace",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("logs with the agent down does not say %q:\n%s", want, stderr)
		}
	}
	if code != exitError || strings.Contains(stderr, "is 'meshfold node ace' running?") {
		t.Errorf("logs with the agent down: exit %d, stderr %q; want 1 and what the stream knows, not a guess", code, stderr)
	}
	t.Logf("logs with the agent down says:\n%s", stderr)
}
