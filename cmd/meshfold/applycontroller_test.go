package main

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/store"
)

// apply with no rollout controller running says so at once, with what
// to check (a fresh user's finding m2: it said nothing, and only 'rollout
// status' said "unattended", 30 s on); with a controller it returns once
// the controller recorded the rollout, saying nothing more. The exit code
// is 0 either way: the start is stored.
func TestApplySaysWhetherAControllerTookIt(t *testing.T) {
	t.Parallel()
	started := regexp.MustCompile(`rollout (\d+) of fleet web started`)
	apply := func(m *mesh, build string, args ...string) (id, errs string, took time.Duration) {
		t.Helper()
		file := writeFleet(t, strings.Replace(fleetYAML, `"web:2"`, `"`+build+`"`, 1))
		start := time.Now()
		out, errs, code := m.cli(t, append([]string{"apply", "-f", file, "--by", "alice"}, args...)...)
		took = time.Since(start)
		s := started.FindStringSubmatch(out)
		if code != 0 || s == nil {
			t.Fatalf("apply %s %v: code %d, want 0 and a rollout started\n%s%s", build, args, code, out, errs)
		}
		return s[1], errs, took
	}

	// No controller: the note, after the wait.
	m := applyMesh(t)
	id, errs, took := apply(m, "web:2")
	t.Logf("no controller: apply took %s:\n%s", took.Round(time.Millisecond), errs)
	note := fmt.Sprintf("note: no rollout controller recorded rollout %s of fleet web within %s: nothing steps it until one runs", id, DefaultControllerWait)
	if !strings.Contains(errs, note) || !strings.Contains(errs, rollout.ControllerCheck) ||
		!strings.Contains(errs, "'meshfold rollout status web' says \"unattended\"") {
		t.Errorf("apply with no controller does not say %q and what to check:\n%s", note, errs)
	}
	// --wait 0: no wait, no note.
	if _, errs, _ := apply(m, "web:3", "--wait", "0"); strings.Contains(errs, "rollout controller") {
		t.Errorf("apply --wait 0 speaks of the controller:\n%s", errs)
	}

	// serve's controller: no note, though the wait allowed is longer
	// than the test's own deadline (2 min): apply returned on the
	// controller's record, not at the end of the wait (which would say
	// the note, its context ended by the test's).
	m = applyMesh(t)
	m.serveReconciler(t)
	id, errs, took = apply(m, "web:2", "--wait", "1h")
	t.Logf("serve's controller: apply of rollout %s took %s", id, took.Round(time.Millisecond))
	if strings.Contains(errs, "rollout controller") {
		t.Errorf("apply with serve's controller running speaks of the controller:\n%s", errs)
	}
}

// A controller that holds the fleet's lease and renews it, but has not
// recorded the rollout within the wait (one refolding after a lost
// consumer: a fresh user's finding m2, recorded 2.2 s later), is not
// reported as no controller at all: apply waits as long again, then
// says that it runs and has not recorded the rollout yet, naming it,
// and does not ask whether one runs.
func TestApplyControllerHoldsTheLeaseAndHasNotRecorded(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	ctx := testCtx(t)
	kv, err := m.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: m.cfg.Name + "_LEASES", History: 1,
		TTL: 15 * time.Second, LimitMarkerTTL: 15 * time.Second, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	// The lease, held and renewed by this process: a controller alive
	// that records nothing.
	l, err := store.AcquireLease(ctx, kv, "rollout.web", store.NewHolder("rollout-controller", "web"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	file := writeFleet(t, fleetYAML)
	start := time.Now()
	out, errs, code := m.cli(t, "apply", "-f", file, "--by", "alice", "--wait", "500ms")
	took := time.Since(start)
	if code != 0 {
		t.Fatalf("apply: code %d\n%s%s", code, out, errs)
	}
	t.Logf("apply took %s:\n%s", took.Round(time.Millisecond), errs)
	want := fmt.Sprintf("note: the rollout controller of fleet web, pid %d on ", os.Getpid())
	if !strings.Contains(errs, want) || !strings.Contains(errs, "within 1s: it runs, and has not recorded it yet") {
		t.Errorf("apply does not say the controller holding the lease has not recorded the rollout yet (%q, within 1s: the wait twice):\n%s", want, errs)
	}
	if strings.Contains(errs, rollout.ControllerCheck) || strings.Contains(errs, "nothing steps it until one runs") {
		t.Errorf("apply asks whether a controller runs, while one holds the lease:\n%s", errs)
	}
}
