package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// applyMesh is a mesh whose nodes ace, bob and cat each hold a want of
// web:1 (no controller: a started rollout stays as stored).
func applyMesh(t *testing.T) *mesh {
	t.Helper()
	m := startMesh(t)
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	for _, n := range []string{"ace", "bob", "cat"} {
		if _, err := pub.Append(testCtx(t), n, events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

func writeFleet(t *testing.T, body string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// A copied fleet file with another fleet's name and an older build is
// refused, dry run or not, naming the nodes and the fleet that owns them
// (the newest rollout of fleet web names them); --take-over takes them.
func TestApplyRefusesAnotherFleetsNodes(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	if out, errs, code := m.cli(t, "apply", "-f", writeFleet(t, fleetYAML), "--by", "alice"); code != 0 {
		t.Fatalf("apply web: code %d\n%s%s", code, out, errs)
	}
	other := strings.Replace(strings.Replace(fleetYAML, "fleet: web", "fleet: other", 1), `"web:2"`, `"web:0"`, 1)
	file := writeFleet(t, other)
	for _, dry := range []bool{true, false} {
		args := []string{"apply", "-f", file, "--by", "mallory"}
		if dry {
			args = append(args, "--dry-run")
		}
		out, errs, code := m.cli(t, args...)
		if code != exitConflict || out != "" {
			t.Fatalf("%v: code %d, want %d (refused, nothing printed)\n%s%s", args, code, exitConflict, out, errs)
		}
		for _, n := range []string{"ace", "bob", "cat"} {
			if !strings.Contains(errs, "node "+n+": fleet web") {
				t.Errorf("%v: the refusal does not name %s and its fleet web:\n%s", args, n, errs)
			}
		}
		if !strings.Contains(errs, "--take-over") {
			t.Errorf("%v: the refusal does not say how to take the nodes over:\n%s", args, errs)
		}
	}
	if out, _, _ := m.cli(t, "rollout", "ls"); strings.Contains(out, "other") {
		t.Fatalf("a refused apply started a rollout:\n%s", out)
	}
	// The same conflict when the other file's wants equal the nodes'
	// newest (web:1, no controller gave web:2 out): refused, exit 3, not
	// "no want changes", exit 0 (a fresh user's finding L2). With
	// --take-over nothing starts, and a note says the nodes stay web's.
	same := writeFleet(t, strings.Replace(strings.Replace(fleetYAML, "fleet: web", "fleet: other", 1), `"web:2"`, `"web:1"`, 1))
	for _, dry := range []bool{true, false} {
		args := []string{"apply", "-f", same, "--by", "mallory"}
		if dry {
			args = append(args, "--dry-run")
		}
		if out, errs, code := m.cli(t, args...); code != exitConflict || !strings.Contains(errs, "node bob: fleet web") {
			t.Errorf("%v, wants unchanged: code %d, want %d\n%s%s", args, code, exitConflict, out, errs)
		}
	}
	if out, errs, code := m.cli(t, "apply", "-f", same, "--by", "mallory", "--take-over"); code != 0 || !strings.Contains(out, "nothing to roll out") ||
		!strings.Contains(errs, "note: ace, bob, cat stay fleet web's") {
		t.Errorf("--take-over, wants unchanged: code %d\n%s%s", code, out, errs)
	}
	// A fleet's own nodes are no conflict: web applies again.
	if out, errs, code := m.cli(t, "apply", "-f", writeFleet(t, strings.Replace(fleetYAML, `"web:2"`, `"web:3"`, 1)), "--by", "alice", "--dry-run"); code != 0 {
		t.Fatalf("apply web again: code %d\n%s%s", code, out, errs)
	}
	out, errs, code := m.cli(t, "apply", "-f", file, "--by", "mallory", "--take-over")
	if code != 0 || !strings.Contains(out, "of fleet other started") {
		t.Fatalf("apply --take-over: code %d\n%s%s", code, out, errs)
	}
	// Now other's newest rollout names them: web is refused in turn.
	if _, errs, code := m.cli(t, "apply", "-f", writeFleet(t, strings.Replace(fleetYAML, `"web:2"`, `"web:3"`, 1)), "--by", "alice", "--dry-run"); code != exitConflict || !strings.Contains(errs, "node ace: fleet other") {
		t.Fatalf("apply web after the take-over: code %d\n%s", code, errs)
	}
}

// A never-pushed sha256: build is refused as `want` refuses it, dry run
// or not, unless --allow-missing-build.
func TestApplyRefusesMissingBuild(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	build := "sha256:" + strings.Repeat("ab", 32)
	file := writeFleet(t, strings.Replace(fleetYAML, `"web:2"`, `"`+build+`"`, 1))
	for _, dry := range []bool{true, false} {
		args := []string{"apply", "-f", file, "--by", "alice"}
		if dry {
			args = append(args, "--dry-run")
		}
		out, errs, code := m.cli(t, args...)
		if code != 1 || out != "" || !strings.Contains(errs, "module web, build "+build) || !strings.Contains(errs, "--allow-missing-build") {
			t.Fatalf("%v: code %d, want 1 (refused, naming the build)\n%s%s", args, code, out, errs)
		}
	}
	if out, _, _ := m.cli(t, "rollout", "ls"); strings.Contains(out, "web") {
		t.Fatalf("a refused apply started a rollout:\n%s", out)
	}
	if out, errs, code := m.cli(t, "apply", "-f", file, "--by", "alice", "--allow-missing-build"); code != 0 || !strings.Contains(out, "of fleet web started") {
		t.Fatalf("apply --allow-missing-build: code %d\n%s%s", code, out, errs)
	}
}

// A node with no event (a typo: evee) is refused, dry run or not (the
// dry run exits as the apply would: a script checking a fleet file with
// it must see the refusal), unless --new.
func TestApplyUnknownNode(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	file := writeFleet(t, strings.Replace(fleetYAML, "  cat: {site: us}\n", "  cat: {site: us}\n  evee: {site: us}\n", 1))
	out, errs, code := m.cli(t, "apply", "-f", file, "--dry-run")
	if code != exitUsage || out != "" || !strings.Contains(errs, "apply would refuse it too") || !strings.Contains(errs, "1 node of fleet web has no event in stream") || !strings.Contains(errs, ": evee (a mistyped name? ") {
		t.Fatalf("apply --dry-run: code %d, want %d (refused as apply refuses, naming evee)\n%s%s", code, exitUsage, out, errs)
	}
	if out, errs, code := m.cli(t, "apply", "-f", file, "--dry-run", "--new"); code != 0 || !strings.Contains(out, "evee") {
		t.Fatalf("apply --dry-run --new: code %d, want 0 with evee's change\n%s%s", code, out, errs)
	}
	out, errs, code = m.cli(t, "apply", "-f", file, "--by", "alice")
	if code != exitUsage || out != "" || !strings.Contains(errs, ": evee (") || !strings.Contains(errs, "--new") {
		t.Fatalf("apply: code %d, want %d (refused, naming evee)\n%s%s", code, exitUsage, out, errs)
	}
	if out, _, _ := m.cli(t, "rollout", "ls"); strings.Contains(out, "web") {
		t.Fatalf("a refused apply started a rollout:\n%s", out)
	}
	if out, errs, code := m.cli(t, "apply", "-f", file, "--by", "alice", "--new"); code != 0 || !strings.Contains(out, "of fleet web started") {
		t.Fatalf("apply --new: code %d\n%s%s", code, out, errs)
	}
}

// A retired node comes back when its fleet is applied again, its want
// unchanged (operations.md: a want brings it back): apply makes it a
// target, says so, and starts a rollout, where it used to print
// "nothing to roll out" and leave it retired.
func TestApplyBringsRetiredNodesBack(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	same := writeFleet(t, strings.Replace(fleetYAML, `"web:2"`, `"web:1"`, 1))
	if out, errs, code := m.cli(t, "apply", "-f", same, "--by", "alice", "--dry-run"); code != 0 || !strings.Contains(out, "nothing to roll out") {
		t.Fatalf("apply of the nodes' own wants: code %d, want nothing to roll out\n%s%s", code, out, errs)
	}
	if out, errs, code := m.cli(t, "retire", "bob", "--by", "alice"); code != 0 {
		t.Fatalf("retire bob: code %d\n%s%s", code, out, errs)
	}
	out, errs, code := m.cli(t, "apply", "-f", same, "--by", "alice")
	if code != 0 || strings.Contains(out, "nothing to roll out") || !strings.Contains(out, "of fleet web started") {
		t.Fatalf("apply after retire bob: code %d, want a rollout started\n%s%s", code, out, errs)
	}
	if !strings.Contains(out, "bob") || !strings.Contains(out, "retired: its want published again brings it back") || strings.Contains(out, "ace") {
		t.Errorf("apply after retire bob does not name bob alone, retired, as its target:\n%s", out)
	}
}

// retire says on stderr that the node is one a fleet's rollout names and
// what the rollout will do: skip it, give it no want; and how to bring
// it back. A node no rollout names gets no such note.
func TestRetireNotesFleetRollout(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	if out, errs, code := m.cli(t, "apply", "-f", writeFleet(t, fleetYAML), "--by", "alice"); code != 0 {
		t.Fatalf("apply web: code %d\n%s%s", code, out, errs)
	}
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	if _, err := pub.Append(testCtx(t), "dan", events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now())); err != nil {
		t.Fatal(err)
	}
	out, errs, code := m.cli(t, "retire", "cat", "--by", "alice")
	if code != 0 {
		t.Fatalf("retire cat: code %d\n%s%s", code, out, errs)
	}
	for _, s := range []string{"cat is a node of fleet web", "skips it and gives it no want", "'meshfold rollout status web' shows it retired, skipped", "applying fleet web again, or 'meshfold want cat', brings cat back"} {
		if !strings.Contains(errs, s) {
			t.Errorf("retire cat: stderr lacks %q:\n%s", s, errs)
		}
	}
	// --force forgets a node whose agent is gone for good; a fleet's node
	// gets the same note (it panicked on a nil map: a fresh user's finding).
	out, errs, code = m.cli(t, "retire", "ace", "--by", "alice", "--force")
	if code != 0 || !strings.Contains(out, "retire ace: stream sequence") || !strings.Contains(errs, "ace is a node of fleet web") {
		t.Errorf("retire ace --force: code %d, want it published with the fleet's note\n%s%s", code, out, errs)
	}
	out, errs, code = m.cli(t, "retire", "dan", "--by", "alice")
	if code != 0 || strings.Contains(errs, "of fleet") {
		t.Errorf("retire dan: code %d; a node no rollout names is said to be a fleet's:\n%s%s", code, out, errs)
	}
}

// apply --dry-run names a module's changed fields (a runs_as change was
// "web (fields)") and says that the users it names are checked by each
// node when it applies, not by the dry run: runs_as nobdy passed it
// without a word.
func TestApplyDryRunNamesFieldsAndUsers(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	file := writeFleet(t, strings.Replace(fleetYAML, `build: "web:2"`, `build: "web:1", runs_as: nobdy`, 1))
	out, errs, code := m.cli(t, "apply", "-f", file, "--dry-run")
	if code != 0 {
		t.Fatalf("apply --dry-run: exit %d\n%s%s", code, out, errs)
	}
	for _, w := range []string{"ace   web (runs_as)", "-- runs_as nobdy: checked by each node when it applies, not here", "fails its apply", "'meshfold rollout why web NODE'"} {
		if !strings.Contains(out, w) {
			t.Errorf("apply --dry-run does not say %q:\n%s", w, out)
		}
	}
	if out, errs, code := m.cli(t, "apply", "-f", writeFleet(t, fleetYAML), "--dry-run"); code != 0 || strings.Contains(out, "runs_as") {
		t.Errorf("apply --dry-run of a build change alone: exit %d, and it speaks of runs_as:\n%s%s", code, out, errs)
	}
}

// apply --dry-run marks a target that is paused or whose agent is down,
// as it marks a retired one, and warns when the canary is such a target:
// the rollout would wait for it and halt (or revert) at healthy_deadline
// (a fresh user's finding 4).
func TestApplyDryRunMarksPausedAndDown(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	if out, errs, code := m.cli(t, "pause", "ace", "--by", "alice"); code != 0 {
		t.Fatalf("pause ace: code %d\n%s%s", code, out, errs)
	}
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	if _, err := pub.Append(testCtx(t), "cat", events.Stamp(&events.Agent{State: events.AgentDown, Claim: "c1", Why: events.WhyExpired}, time.Now())); err != nil {
		t.Fatal(err)
	}
	out, errs, code := m.cli(t, "apply", "-f", writeFleet(t, fleetYAML), "--dry-run")
	if code != 0 {
		t.Fatalf("apply --dry-run: exit %d\n%s%s", code, out, errs)
	}
	for _, w := range []string{"canary  ace   paused by alice: web", "cat   agent down: web",
		"-- warning: canary ace (paused by alice) cannot become healthy as it is", "halts at healthy_deadline"} {
		if !strings.Contains(out, w) {
			t.Errorf("apply --dry-run does not say %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "bob   paused") || strings.Contains(out, "bob   agent") {
		t.Errorf("apply --dry-run marks bob, which is neither paused nor down:\n%s", out)
	}
}

// A node whose agent is down and is not the canary spends max_unavailable
// 1 before the rollout starts, so nothing moves: apply and its dry run
// warn, in the words of 'rollout status' (a fresh user's finding U20: no
// warning, and a promote loop hung for 10 minutes).
func TestApplyWarnsOfASpentBudget(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	if _, err := pub.Append(testCtx(t), "cat", events.Stamp(&events.Agent{State: events.AgentDown, Claim: "c1", Why: events.WhyExpired}, time.Now())); err != nil {
		t.Fatal(err)
	}
	warn := "-- warning: the budget is spent before the rollout starts: 1 target of batch 1 waits for the budget: 1 of max_unavailable 1 unavailable: cat (agent down); no step of the rollout is under way"
	file := writeFleet(t, fleetYAML)
	for _, args := range [][]string{{"--dry-run"}, {"--by", "alice"}} {
		out, errs, code := m.cli(t, append([]string{"apply", "-f", file}, args...)...)
		if code != 0 || !strings.Contains(out, warn) {
			t.Errorf("apply %v: exit %d, does not say\n%s\n%s%s", args, code, warn, out, errs)
		}
	}
	two := strings.Replace(fleetYAML, "max_unavailable: 1", "max_unavailable: 2", 1)
	if out, errs, code := m.cli(t, "apply", "-f", writeFleet(t, two), "--dry-run"); code != 0 || strings.Contains(out, "budget is spent") {
		t.Errorf("apply --dry-run with max_unavailable 2: exit %d, warns of a spent budget:\n%s%s", code, out, errs)
	}
}

// A canary that holds every target (canary: 9 of 3 targets) is warned of,
// by the dry run and by apply, instead of making every node a canary
// without a word (a fresh user's finding); a canary below the targets is
// not.
func TestApplyWarnsOfACanaryOfEveryTarget(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	big := strings.Replace(fleetYAML, "canary: 1,", "canary: 9,", 1)
	out, errs, code := m.cli(t, "apply", "-f", writeFleet(t, big), "--dry-run")
	if code != 0 {
		t.Fatalf("apply --dry-run: exit %d\n%s%s", code, out, errs)
	}
	if !strings.Contains(out, "-- warning: canary 9 is more than the 3 targets (cut to 3): every target is a canary") {
		t.Errorf("apply --dry-run of canary 9 among 3 targets does not warn:\n%s", out)
	}
	out, errs, code = m.cli(t, "apply", "-f", writeFleet(t, big), "--by", "alice")
	if code != 0 || !strings.Contains(out, "-- warning: canary 9 is more than the 3 targets") || !strings.Contains(out, "started") {
		t.Errorf("apply of canary 9 among 3 targets: exit %d, no warning:\n%s%s", code, out, errs)
	}
	if out, _, _ := m.cli(t, "apply", "-f", writeFleet(t, strings.Replace(fleetYAML, "web:2", "web:3", 1)), "--dry-run"); strings.Contains(out, "every target is a canary") {
		t.Errorf("apply --dry-run of canary 1 among 3 targets warns:\n%s", out)
	}
}

// A want by hand on a target of a running rollout is refused, exit 3,
// dry run or not, naming the fleet, the rollout and how to go on (a
// fresh user's finding 3: it was published silently, and the whole
// rollout halted as a conflict and was reverted); --force publishes it;
// a node the rollout does not target, and any node once the rollout is
// aborted, takes a want as before.
func TestWantRefusesRolloutTarget(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	if _, err := pub.Append(testCtx(t), "dan", events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now())); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := m.cli(t, "apply", "-f", writeFleet(t, fleetYAML), "--by", "alice"); code != 0 {
		t.Fatalf("apply web: code %d\n%s%s", code, out, errs)
	}
	want := writeWantFile(t, `{"modules":[{"name":"web","build":"web:9"}]}`)
	wants := func() int { return len(readEvents(t, m, "bob", events.KindWant)) }
	before := wants()
	for _, args := range [][]string{{"want", "bob", "-f", want}, {"want", "bob", "-f", want, "--dry-run"}} {
		out, errs, code := m.cli(t, args...)
		if code != exitConflict || out != "" {
			t.Errorf("%v: exit %d, want %d, nothing printed\n%s%s", args, code, exitConflict, out, errs)
		}
		for _, s := range []string{"node bob is a target of fleet web's rollout", "(running)", "halts the rollout", "nothing was published",
			"meshfold rollout abort web", "--force"} {
			if !strings.Contains(errs, s) {
				t.Errorf("%v: the refusal does not say %q:\n%s", args, s, errs)
			}
		}
	}
	if n := wants(); n != before {
		t.Fatalf("a refused want was published: %d wants of bob, want %d", n, before)
	}
	if out, errs, code := m.cli(t, "want", "dan", "-f", want); code != 0 {
		t.Errorf("want of dan, no target: exit %d\n%s%s", code, out, errs)
	}
	if out, errs, code := m.cli(t, "want", "bob", "-f", want, "--force"); code != 0 || !strings.Contains(out, "want bob: stream sequence") {
		t.Errorf("want bob --force: exit %d\n%s%s", code, out, errs)
	}
	if out, errs, code := m.cli(t, "rollout", "abort", "web", "--by", "alice"); code != 0 {
		t.Fatalf("rollout abort: exit %d\n%s%s", code, out, errs)
	}
	if out, errs, code := m.cli(t, "want", "cat", "-f", want); code != 0 {
		t.Errorf("want of cat after the abort: exit %d\n%s%s", code, out, errs)
	}
}

// A group whose selector matches no owned node (a typo: site: ue) is
// refused, dry run or not, exit 2, at its line and column, naming
// --allow-empty-group, and nothing is published; with the flag it is
// the warning it was, and the dry run warns that each node then runs
// nothing (a fresh user's finding U13: the typo rolled out the module's
// removal to every node, exit 0, behind one warning line).
func TestApplyRefusesAGroupSelectingNothing(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	file := writeFleet(t, strings.Replace(fleetYAML, "select: {}", "select: {site: ue}", 1))
	for _, args := range [][]string{{"--dry-run"}, {"--by", "alice"}} {
		out, errs, code := m.cli(t, append([]string{"apply", "-f", file}, args...)...)
		if code != exitUsage || out != "" || !strings.Contains(errs, file+":8:5: error: groups[0].select: selects no owned node: its modules (web) are in no node's want") ||
			!strings.Contains(errs, "no owned node has site: ue (they have site: eu, us)") || !strings.Contains(errs, "--allow-empty-group") {
			t.Fatalf("apply %v of a group selecting nothing: code %d, want %d naming the select and the flag\n%s%s", args, code, exitUsage, out, errs)
		}
	}
	if out, _, _ := m.cli(t, "rollout", "ls"); strings.Contains(out, "web") {
		t.Fatalf("a refused apply started a rollout:\n%s", out)
	}
	out, errs, code := m.cli(t, "apply", "-f", file, "--dry-run", "--allow-empty-group")
	if code != 0 || !strings.Contains(errs, file+":8:5: warning: groups[0].select: selects no owned node") ||
		!strings.Contains(out, "-- warning: ace, bob, cat: the new want has no module") {
		t.Fatalf("apply --dry-run --allow-empty-group: code %d, want 0 with both warnings\n%s%s", code, out, errs)
	}
	if out, _, _ := m.cli(t, "apply", "-f", writeFleet(t, fleetYAML), "--dry-run"); strings.Contains(out, "the new want has no module") {
		t.Errorf("apply --dry-run of a want with a module warns of none:\n%s", out)
	}
}

// A want that declares a file and has no provisioner module can never be
// filled (its plan names no provisioner account): want, apply and their
// dry runs warn before anything moves (a fresh user's finding U25: the
// rollout found out at healthy_deadline); with a provisioner module they
// do not.
func TestWantAndApplyWarnOfUnfillableFiles(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	warn := "mesh-build-go declares /run/mesh-build-go/broker.creds but this want has no provisioner module: the node accepts no write of it"
	creds := `{"name":"mesh-build-go","build":"mbg:1","runs_as":"nobody","files":[{"path":"/run/mesh-build-go/broker.creds","mode":"0600"}]}`
	noProv := writeWantFile(t, `{"modules":[{"name":"web","build":"web:1"},`+creds+`]}`)
	for _, args := range [][]string{{"--dry-run"}, {}} {
		out, errs, code := m.cli(t, append([]string{"want", "ace", "-f", noProv}, args...)...)
		if code != 0 || !strings.Contains(errs, "warning: "+warn) {
			t.Errorf("want ace %v: exit %d, does not warn\n%s\n%s%s", args, code, warn, out, errs)
		}
	}
	withProv := writeWantFile(t, `{"modules":[{"name":"prov","build":"prov:1","runs_as":"meshprov","provisioner":true},`+creds+`]}`)
	if out, errs, code := m.cli(t, "want", "bob", "-f", withProv, "--dry-run"); code != 0 || strings.Contains(errs, "no provisioner module") {
		t.Errorf("want bob --dry-run with a provisioner module: exit %d, warns:\n%s%s", code, out, errs)
	}
	group := `modules: [{name: web, build: "web:2"}, {name: mesh-build-go, build: "mbg:1", runs_as: nobody, files: [{path: /run/mesh-build-go/broker.creds, mode: "0600"}]}]`
	file := writeFleet(t, strings.Replace(fleetYAML, `modules: [{name: web, build: "web:2"}]`, group, 1))
	for _, args := range [][]string{{"--dry-run"}, {"--by", "alice"}} {
		out, errs, code := m.cli(t, append([]string{"apply", "-f", file}, args...)...)
		if code != 0 || !strings.Contains(out, "-- warning: ace, bob, cat: "+warn) {
			t.Errorf("apply %v: exit %d, does not warn\n%s\n%s%s", args, code, warn, out, errs)
		}
	}
}

// Apply warns of a target whose agent does not trust the key the
// reconciler signs its plans with (a fresh user's finding F1: the node
// refuses every plan of the rollout and fails it, and nothing said so
// before the start). The key is the newest plan's signer; each agent's
// keys are what its up listed. An older agent's up lists none: no
// warning for it.
func TestApplyWarnsOfAgentsThatDoNotTrustTheKey(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	ctx := testCtx(t)
	subj := m.cfg.Subjects()
	newSigner := func() *store.Signer {
		kp, err := store.NewSigningKey()
		if err != nil {
			t.Fatal(err)
		}
		s, err := store.NewSigner(kp)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	current, old := newSigner(), newSigner()
	// The reconciler's newest plan, ace's, signed with its current key.
	data, _ := json.Marshal(events.Stamp(&events.Plan{Cause: 1, Want: 1, Modules: []events.PlanModule{{Name: "web", Build: "web:1"}}}, time.Now()))
	h := nats.Header{}
	if err := current.Sign(h, "ace", events.KindPlan, "ace.plan.test", data); err != nil {
		t.Fatal(err)
	}
	if _, err := m.js.PublishMsg(ctx, &nats.Msg{Subject: subj.Event("ace", events.KindPlan), Data: data, Header: h}); err != nil {
		t.Fatal(err)
	}
	pub := store.NewPublisher(m.js, subj)
	for node, trusts := range map[string][]string{"ace": {current.PublicKey()}, "bob": {old.PublicKey()}, "cat": nil} {
		if _, err := pub.Append(ctx, node, events.Stamp(&events.Agent{State: events.AgentUp, Claim: "c-" + node, Trusts: trusts}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	out, errs, code := m.cli(t, "apply", "-f", writeFleet(t, fleetYAML), "--dry-run")
	if code != 0 {
		t.Fatalf("apply --dry-run: exit %d\n%s%s", code, out, errs)
	}
	want := "warning: bob: its agent does not trust " + current.PublicKey() + ", the key the reconciler signs its plans with"
	if !strings.Contains(errs, want) || !strings.Contains(errs, "it trusts "+old.PublicKey()[:8]+"… only") {
		t.Errorf("apply --dry-run does not say %q:\n%s", want, errs)
	}
	if strings.Contains(errs, "warning: ace") || strings.Contains(errs, "ace, ") || strings.Contains(errs, "cat") {
		t.Errorf("apply --dry-run names ace (trusts the key) or cat (an older agent):\n%s", errs)
	}
}

// Targets whose new want gives a module requires_approval at a build new
// to them wait for an approval, spending max_unavailable: apply and its
// dry run say so before anything moves, naming the targets and the
// approve command (a fresh user's finding M3 of fresh10: 20 such targets
// stalled a rollout of 200 without a word before). A module whose build
// does not change waits for nothing: no warning.
func TestApplyWarnsOfTargetsThatWaitForAnApproval(t *testing.T) {
	m := applyMesh(t)
	gated := strings.Replace(fleetYAML, `modules: [{name: web, build: "web:2"}]`,
		`modules: [{name: web, build: "web:2"}]
  - name: us
    select: {site: us}
    modules: [{name: db, build: "db:7", requires_approval: true}]`, 1)
	warn := "-- warning: cat: db requires_approval at db:7: each waits for an approval (waiting-approval, spending max_unavailable) unless one is given already; " +
		"approve ahead with 'meshfold approve NODE... db db:7 --by NAME --ahead'"
	for _, args := range [][]string{{"--dry-run"}, {"--by", "alice"}} {
		out, errs, code := m.cli(t, append([]string{"apply", "-f", writeFleet(t, gated)}, args...)...)
		if code != 0 || !strings.Contains(out, warn) || strings.Count(out, "requires_approval at") != 1 {
			t.Errorf("apply %v: exit %d, does not say once\n%s\n%s%s", args, code, warn, out, errs)
		}
	}
	if out, errs, code := m.cli(t, "apply", "-f", writeFleet(t, fleetYAML), "--dry-run"); code != 0 || strings.Contains(out, "requires_approval at") {
		t.Errorf("apply --dry-run of no gated module: exit %d, warns of an approval:\n%s%s", code, out, errs)
	}
}
