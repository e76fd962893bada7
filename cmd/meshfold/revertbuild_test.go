package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/store"
)

// rollout revert refuses (exit 1, nothing published) a revert that would
// give a target back a previous want naming a build removed since with
// 'build rm --force', naming the target and the build and how to mend it
// (a reviewer's finding: it published, and the revert failed to fetch);
// --allow-missing-build reverts anyway; once the build is pushed again
// the check passes.
func TestRevertRefusesARemovedBuild(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	m.serveReconciler(t)
	ctx := testCtx(t)
	v1, v2 := pushExe(t, m, "web", "1"), pushExe(t, m, "web", "2")
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	for _, n := range []string{"ace", "bob", "cat"} {
		if _, err := pub.Append(ctx, n, events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: v1}}}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	fleet := strings.Replace(fleetYAML, `"web:2"`, `"`+v2+`"`, 1)
	if out, errs, code := m.cli(t, "apply", "-f", writeFleet(t, fleet), "--by", "alice"); code != 0 {
		t.Fatalf("apply: exit %d\n%s%s", code, out, errs)
	}
	// The canary ace has v2: a revert gives it v1 back.
	waitStatus(t, m, func(v rollout.View) bool { return len(v.Targets) == 3 && v.Targets[0].Published > 0 })
	if _, errs, code := m.cli(t, "build", "rm", v1, "--force"); code != 0 {
		t.Fatalf("rm --force: exit %d %s", code, errs)
	}
	out, errs, code := m.cli(t, "rollout", "revert", "web", "--by", "alice")
	if code != exitError || out != "" {
		t.Fatalf("revert to a removed build: exit %d, want %d\n%s%s", code, exitError, out, errs)
	}
	for _, want := range []string{"refused", "1 target would get back a build the builds bucket no longer holds", "target ace, previous want #",
		"module web, build " + v1, "nothing was published", "push each build again", "--allow-missing-build"} {
		if !strings.Contains(errs, want) {
			t.Errorf("revert's refusal does not say %q:\n%s", want, errs)
		}
	}
	if reverted(t, m, "web") {
		t.Fatal("a refused revert was published")
	}
	out, errs, code = m.cli(t, "rollout", "revert", "web", "--by", "alice", "--allow-missing-build")
	if code != 0 || !strings.Contains(out, "revert web: #") || !reverted(t, m, "web") {
		t.Fatalf("revert --allow-missing-build: exit %d\n%s%s", code, out, errs)
	}
}

// reverted reports whether the stream holds a revert of fleet.
func reverted(t *testing.T, m *mesh, fleet string) bool {
	t.Helper()
	stream, err := m.js.Stream(testCtx(t), m.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	_, err = stream.GetLastMsgForSubject(testCtx(t), m.cfg.Subjects().Rollout(fleet, string(rollout.KindRevert)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}
