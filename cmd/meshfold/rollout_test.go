package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/store"
)

const fleetYAML = `fleet: web
nodes:
  ace: {site: eu}
  bob: {site: eu}
  cat: {site: us}
groups:
  - name: all
    select: {}
    modules: [{name: web, build: "web:2"}]
rollout: {canary: 1, batch: 2, max_unavailable: 1, min_healthy: 0s}
`

// waitStatus polls `rollout status FLEET -o json` until ok says yes (the
// controller acts on its own: poll its view).
func waitStatus(t *testing.T, m *mesh, ok func(rollout.View) bool) rollout.View {
	t.Helper()
	var v rollout.View
	waitfor.Value(t, 30*time.Second, "rollout status as expected", func() (string, bool) {
		out, errs, code := m.cli(t, "rollout", "status", "web", "-o", "json")
		if code != 0 {
			return fmt.Sprintf("code %d\n%s%s", code, out, errs), false
		}
		v = rollout.View{}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("status -o json: %v\n%s", err, out)
		}
		return out, ok(v)
	})
	return v
}

// apply, its dry run, and every rollout verb, against serve's controller
// (no agent: the canary's want is published, its plan never settles).
func TestRolloutVerbs(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	m.serveReconciler(t)
	ctx := testCtx(t)
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	for _, n := range []string{"ace", "bob", "cat"} {
		if _, err := pub.Append(ctx, n, events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(file, []byte(fleetYAML), 0o600); err != nil {
		t.Fatal(err)
	}

	out, errs, code := m.cli(t, "apply", "-f", file, "--dry-run")
	if code != 0 || !strings.Contains(out, "3 targets of 3 nodes") || !strings.Contains(out, "canary  ace   web web:1 → web:2") {
		t.Fatalf("apply --dry-run: code %d\n%s%s", code, out, errs)
	}
	if out, _, _ := m.cli(t, "rollout", "ls", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("a dry run started a rollout: %s", out)
	}
	if _, errs, code := m.cli(t, "apply", "-f", file); code != 2 || !strings.Contains(errs, "--by") {
		t.Fatalf("apply without --by: code %d, %s", code, errs)
	}
	out, errs, code = m.cli(t, "apply", "-f", file, "--by", "alice")
	if code != 0 || !strings.Contains(out, "rollout ") || !strings.Contains(out, " of fleet web started") {
		t.Fatalf("apply: code %d\n%s%s", code, out, errs)
	}

	v := waitStatus(t, m, func(v rollout.View) bool { return len(v.Targets) == 3 && v.Targets[0].Published > 0 })
	if v.Targets[0].Node != "ace" || v.Targets[1].Published != 0 {
		t.Fatalf("only the canary is given its want: %+v", v.Targets)
	}
	out, _, code = m.cli(t, "rollout", "status", "web")
	if code != 0 || !strings.Contains(out, "fleet web, rollout") || !strings.Contains(out, "ace   1") {
		t.Errorf("status:\n%s", out)
	}
	// No node has a have: the builds line says so, not a header over
	// nothing (a fresh user's finding L9).
	if !strings.HasSuffix(out, "builds: none known to run yet (no have of the fleet's nodes)\n") {
		t.Errorf("status, no have: the builds line:\n%s", out)
	}
	// The node's timeline marks the step that changed its want: which
	// rollout, batch and why (issue 23: why did ace get web:2 then).
	id, want := v.Rollout, v.Targets[0].Published
	out, errs, code = m.cli(t, "audit", "ace")
	line := fmt.Sprintf("%d ", want)
	for l := range strings.Lines(out) {
		if strings.HasPrefix(strings.TrimSpace(l), line) {
			line = l
		}
	}
	if code != 0 || !strings.Contains(line, fmt.Sprintf("want    rollout #%d canary: web web:1→web:2", id)) {
		t.Errorf("audit ace: code %d: the want #%d is not marked as rollout %d's canary step: %q\n%s%s", code, want, id, line, out, errs)
	}
	out, errs, code = m.cli(t, "audit", "ace", "-o", "json")
	var entries []struct {
		Seq     uint64
		Rollout *struct {
			Fleet, Step, Why string
			Rollout          uint64
		}
	}
	if err := json.Unmarshal([]byte(out), &entries); code != 0 || err != nil {
		t.Fatalf("audit ace -o json: code %d, %v\n%s%s", code, err, out, errs)
	}
	for _, e := range entries {
		switch {
		case e.Seq == want && (e.Rollout == nil || e.Rollout.Fleet != "web" || e.Rollout.Rollout != id || e.Rollout.Step != "forward" ||
			e.Rollout.Why != "the canary, batch 1 of 2; applied by alice"):
			t.Errorf("audit -o json: want #%d marked %+v", want, e.Rollout)
		case e.Seq != want && e.Rollout != nil:
			t.Errorf("audit -o json: #%d marked %+v, though no rollout published it", e.Seq, e.Rollout)
		}
	}
	out, _, _ = m.cli(t, "audit", "ace", "--why", fmt.Sprint(want))
	if !strings.Contains(out, fmt.Sprintf("rollout   rollout web #%d, forward step: the canary, batch 1 of 2; applied by alice", id)) {
		t.Errorf("audit ace --why %d does not name the step:\n%s", want, out)
	}
	out, _, code = m.cli(t, "rollout", "why", "web", "ace")
	if code != 0 || out == "" {
		t.Errorf("why: code %d\n%s", code, out)
	}
	out, _, code = m.cli(t, "rollout", "ls")
	if code != 0 || !strings.Contains(out, "web") {
		t.Errorf("ls: code %d\n%s", code, out)
	}
	for _, verb := range []string{"pause", "resume"} {
		if out, errs, code := m.cli(t, "rollout", verb, "web", "--by", "alice"); code != 0 || !strings.HasPrefix(out, verb+" web: #") {
			t.Errorf("%s: code %d\n%s%s", verb, code, out, errs)
		}
		// The phase says the pause (a fresh user's finding L3: it said
		// "running" under a pause), and no longer after the resume.
		status, _, _ := m.cli(t, "rollout", "status", "web")
		ls, _, _ := m.cli(t, "rollout", "ls")
		paused := verb == "pause"
		if strings.Contains(status, ": running, paused, batch 1 of 2\n") != paused || strings.Contains(ls, "  running, paused  ") != paused {
			t.Errorf("after %s: status and ls:\n%s%s", verb, status, ls)
		}
	}
	// A verb the rollout would ignore is said, with why, exit 1, and
	// not published: a promote before the canary is done, a second
	// resume.
	stream, err := m.js.Stream(ctx, m.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	last := func(verb string) uint64 {
		t.Helper()
		msg, err := stream.GetLastMsgForSubject(ctx, m.cfg.Subjects().Rollout("web", verb))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return msg.Sequence
	}
	for _, c := range []struct{ verb, why string }{
		{"promote", "the canary batch is not done (0 of 1 done): canary ace: changing"},
		{"resume", "rollout running, not paused"},
	} {
		before := last(c.verb)
		out, errs, code := m.cli(t, "rollout", c.verb, "web", "--by", "alice")
		if code != 1 || out != "" || !strings.Contains(errs, "nothing published") || !strings.Contains(errs, c.why) {
			t.Errorf("early %s: code %d, want 1 and why (%s)\n%s%s", c.verb, code, c.why, out, errs)
		}
		if after := last(c.verb); after != before {
			t.Errorf("early %s published: its subject's newest is #%d, was #%d", c.verb, after, before)
		}
	}
	if _, errs, code := m.cli(t, "rollout", "pause", "nofleet", "--by", "alice"); code != 2 {
		t.Errorf("pause of a fleet with no rollout: code %d, %s", code, errs)
	}
	if _, _, code := m.cli(t, "rollout", "abort", "web"); code != 2 {
		t.Errorf("abort without --by: code %d", code)
	}
	if out, errs, code := m.cli(t, "rollout", "abort", "web", "--by", "alice", "--reason", "test"); code != 0 {
		t.Fatalf("abort: code %d\n%s%s", code, out, errs)
	}
	v = waitStatus(t, m, func(v rollout.View) bool { return v.Phase == rollout.Aborted })
	if v.End == nil || v.End.By != "alice" {
		t.Errorf("aborted by %+v", v.End)
	}
}
