package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
)

// pushExe pushes an executable packed from dir/name (its content made
// distinct by body) and returns its build.
func pushExe(t testing.TB, m *mesh, name, body string) string {
	t.Helper()
	exe := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n# "+body+"\nexec sleep 1000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, errs, code := m.cli(t, "build", "push", exe)
	if code != 0 {
		t.Fatalf("push %s: exit %d %s", name, code, errs)
	}
	return strings.TrimSpace(out)
}

// build rm refuses a build that a node's newest want names, a node's
// newest have lists, or a rollout would give back on a revert, with exit
// 3 naming each (a count and the first few) and what to do, removing
// nothing; a node retired since its want is not counted; --force removes
// it and says what it breaks; a build nothing names is removed as before.
func TestBuildRmRefusesANamedBuild(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	m.serveReconciler(t)
	ctx := testCtx(t)
	v1, v2 := pushExe(t, m, "web", "1"), pushExe(t, m, "web", "2")
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	for _, n := range []string{"ace", "bob", "cat", "eve"} {
		if _, err := pub.Append(ctx, n, events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: v1}}}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	// dan runs v1 (its agent says so), whatever its want.
	if _, err := pub.Append(ctx, "dan", events.Stamp(&events.Have{Modules: []events.HaveModule{{Name: "web", Build: v1, State: events.Running}}}, time.Now())); err != nil {
		t.Fatal(err)
	}
	// eve is retired since: it runs nothing, and a want brings it back.
	if _, err := pub.Append(ctx, "eve", events.Stamp(&events.Retire{By: "ops"}, time.Now())); err != nil {
		t.Fatal(err)
	}
	// A rollout to v2 gives its canary ace v2: a revert would give ace
	// v1 back.
	fleet := strings.Replace(fleetYAML, `"web:2"`, `"`+v2+`"`, 1)
	if out, errs, code := m.cli(t, "apply", "-f", writeFleet(t, fleet), "--by", "alice"); code != 0 {
		t.Fatalf("apply: exit %d\n%s%s", code, out, errs)
	}
	waitStatus(t, m, func(v rollout.View) bool { return len(v.Targets) == 3 && v.Targets[0].Published > 0 })

	out, errs, code := m.cli(t, "build", "rm", v1)
	if code != exitConflict || out != "" {
		t.Fatalf("rm of a named build: exit %d, want %d\n%s%s", code, exitConflict, out, errs)
	}
	for _, want := range []string{
		"refused: " + v1[:19] + " is still named; nothing was removed",
		"2 nodes want it (their newest want): bob, cat\n",
		"1 node runs it (its newest have): dan\n",
		"of fleet web (running): a revert gives 1 node a previous want naming it: ace",
		`"no such bundle"`, "--force",
	} {
		if !strings.Contains(errs, want) {
			t.Errorf("rm's refusal does not say %q:\n%s", want, errs)
		}
	}
	if regexp.MustCompile(`\beve\b`).MatchString(errs) {
		t.Errorf("rm's refusal counts eve, retired since its want:\n%s", errs)
	}
	if out, _, _ := m.cli(t, "build", "ls"); !strings.Contains(out, v1) {
		t.Fatalf("a refused rm removed %s:\n%s", v1, out)
	}

	// A build nothing names goes as before.
	v3 := pushExe(t, m, "web", "3")
	if out, errs, code := m.cli(t, "build", "rm", v3); code != 0 || out != "" || strings.Contains(errs, "warning") {
		t.Fatalf("rm of a build nothing names: exit %d\n%s%s", code, out, errs)
	}
	out, errs, code = m.cli(t, "build", "rm", v1, "--force")
	if code != 0 || !strings.Contains(errs, "removed "+v1[:19]) || !strings.Contains(errs, "warning: --force: it was still named") ||
		!strings.Contains(errs, "bob, cat") || !strings.Contains(errs, `"no such bundle"`) {
		t.Fatalf("rm --force: exit %d\n%s%s", code, out, errs)
	}
	if out, _, _ := m.cli(t, "build", "ls"); strings.Contains(out, v1) {
		t.Fatalf("rm --force kept %s:\n%s", v1, out)
	}
}

// A build of no build's form ("garbage", a bundle's name) is refused by
// want, apply and their dry runs, --allow-missing-build or not, with exit
// 2, naming the module, the build and the stored builds nearest to it; a
// bundle build a digit off a stored one is refused as not pushed (exit
// 1), naming the stored one.
func TestBuildFormRefused(t *testing.T) {
	// Not parallel: the nearest builds it checks for are listed within 1 s
	// (listBuilds), and left out after it.
	m := applyMesh(t)
	pushed := pushExe(t, m, "mesh-build-go", "1")
	for _, tc := range []struct {
		build, says string
		code        int
	}{
		{"garbage", "none is near it; the newest stored (1 in all, 'meshfold build ls'):\n      " + pushed, exitUsage},
		{"mesh-build-go", "the nearest stored:\n      " + pushed + "  from mesh-build-go", exitUsage},
		{pushed[:len(pushed)-1] + "x", "the nearest stored:\n      " + pushed, exitUsage},
		// A slip of the bundle scheme is no other runtime's build (a
		// fresh user's finding 1: "sh256:abc" was published, exit 0).
		{"sh256:abc", "none is near it; the newest stored (1 in all, 'meshfold build ls'):\n      " + pushed, exitUsage},
		{"sh256:" + strings.TrimPrefix(pushed, "sha256:"), `nearly "sha256"`, exitUsage},
		{"sh256:" + strings.TrimPrefix(pushed, "sha256:"), "the nearest stored:\n      " + pushed, exitUsage},
		{pushed[:len(pushed)-1] + map[bool]string{true: "0", false: "1"}[!strings.HasSuffix(pushed, "0")], "the nearest stored:\n      " + pushed, exitError},
	} {
		fleet := writeFleet(t, strings.Replace(fleetYAML, `"web:2"`, `"`+tc.build+`"`, 1))
		want := writeWantFile(t, `{"modules":[{"name":"web","build":"`+tc.build+`"}]}`)
		runs := [][]string{
			{"apply", "-f", fleet, "--by", "alice"}, {"apply", "-f", fleet, "--dry-run"},
			{"want", "ace", "-f", want}, {"want", "ace", "-f", want, "--dry-run"},
		}
		if tc.code == exitUsage { // no flag lets a malformed build through
			runs = append(runs, []string{"apply", "-f", fleet, "--by", "alice", "--allow-missing-build"},
				[]string{"want", "ace", "-f", want, "--allow-missing-build"})
		}
		for _, args := range runs {
			out, errs, code := m.cli(t, args...)
			if code != tc.code || out != "" || !strings.Contains(errs, "module web, build "+tc.build+":") ||
				!strings.Contains(errs, tc.says) || !strings.Contains(errs, "nothing was published") {
				t.Errorf("%v: exit %d, want %d saying %q\n%s%s", args, code, tc.code, tc.says, out, errs)
			}
			// What a build is, said once (a fresh user's finding L6:
			// "garbage" was told it twice, in the line and as the last).
			if n := strings.Count(errs, "(img:2.10)"); n > 1 || tc.code == exitUsage && n == 0 {
				t.Errorf("%v: what a build is is said %d times:\n%s", args, n, errs)
			}
		}
	}
	if out, _, _ := m.cli(t, "rollout", "ls"); strings.Contains(out, "web") {
		t.Fatalf("a refused apply started a rollout:\n%s", out)
	}
	// Another runtime's build passes by form (only its runtime knows it),
	// with the note want gives: the process runtime cannot run it.
	for _, args := range [][]string{{"apply", "-f", writeFleet(t, fleetYAML), "--dry-run"}, {"apply", "-f", writeFleet(t, fleetYAML), "--by", "alice"}} {
		if out, errs, code := m.cli(t, args...); code != 0 || !strings.Contains(errs, "web (web:2): no bundle build") {
			t.Fatalf("%v: exit %d, want 0 and a note that the process runtime cannot run web:2\n%s%s", args, code, out, errs)
		}
	}
}

// Under --auth: the operator's build rm reads what names a build within
// its role (exit 3, naming the node, not a permission error), and a
// controller's want of a build of no form is refused, exit 2, naming the
// stored builds (the controller may list the bucket's metadata).
func TestBuildGuardsWithCredentials(t *testing.T) {
	// Not parallel: it times a denial (5 s).
	ctx := testCtx(t)
	base := t.TempDir()
	dir := filepath.Join(base, "auth")
	if code, _, errs := runCLI(ctx, "auth", "init", "--dir", dir); code != exitOK {
		t.Fatalf("auth init: %d %s", code, errs)
	}
	d, err := auth.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	serveOut := newNoteBuffer()
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan int, 1)
	go func() {
		done <- run(sctx, []string{"serve", "--auth", dir, "--data", filepath.Join(base, "data"), "--listen", "127.0.0.1:0", "--log-level", "warn"}, nil, serveOut, serveOut)
	}()
	t.Cleanup(func() { cancel(); <-done })
	serveOut.waitText(ctx, t, "serve", "serving NATS at ")
	url := regexp.MustCompile(`serving NATS at (\S+);`).FindStringSubmatch(serveOut.String())[1]
	as := func(user string) []string { return []string{"--server", url, "--creds", d.CredsPath(user)} }

	exe := filepath.Join(base, "web")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\nexec sleep 1000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(ctx, append([]string{"build", "push", exe}, as("operator")...)...)
	if code != exitOK {
		t.Fatalf("push: %d %s", code, errs)
	}
	build := strings.TrimSpace(out)
	if code, out, errs := runCLI(ctx, append([]string{"want", "ace", "-f", writeWantFile(t, `{"modules":[{"name":"web","build":"`+build+`"}]}`), "--new"}, as("controller")...)...); code != exitOK {
		t.Fatalf("want: %d %s %s", code, out, errs)
	}
	start := time.Now()
	code, _, errs = runCLI(ctx, append([]string{"want", "ace", "-f", writeWantFile(t, `{"modules":[{"name":"web","build":"garbage"}]}`)}, as("controller")...)...)
	if took := time.Since(start); code != exitUsage || !strings.Contains(errs, "module web, build garbage:") || !strings.Contains(errs, build+"  from web") ||
		strings.Contains(errs, "iolation") || took > 5*time.Second {
		t.Errorf("want of garbage as controller: exit %d after %s\n%s", code, took, errs)
	}
	code, _, errs = runCLI(ctx, append([]string{"build", "rm", build}, as("operator")...)...)
	if code != exitConflict || !strings.Contains(errs, "1 node wants it (its newest want): ace") || strings.Contains(errs, "iolation") {
		t.Errorf("build rm as operator: exit %d\n%s", code, errs)
	}
	if s := serveOut.String(); strings.Contains(s, "iolation") {
		t.Errorf("serve logged a violation:\n%s", s)
	}
}

// build rm refuses a build a rollout has yet to give out: a rollout no
// target of which was stepped yet (here no controller runs; a spent
// budget holds one the same way) names it in no node's want, and its
// steps would then fail to fetch it. Once the rollout can no longer step
// (aborted), the build goes (reviewer's finding).
func TestBuildRmRefusesABuildARolloutWillGive(t *testing.T) {
	t.Parallel()
	m := applyMesh(t) // no controller: the rollout is never stepped
	v2 := pushExe(t, m, "web", "2")
	fleet := strings.Replace(fleetYAML, `"web:2"`, `"`+v2+`"`, 1)
	if out, errs, code := m.cli(t, "apply", "-f", writeFleet(t, fleet), "--by", "alice"); code != 0 {
		t.Fatalf("apply: exit %d\n%s%s", code, out, errs)
	}
	out, errs, code := m.cli(t, "build", "rm", v2)
	if code != exitConflict || !strings.Contains(errs, "of fleet web (running): its next steps give 3 nodes a want naming it: ace, bob, cat") {
		t.Fatalf("rm of a build a running rollout has yet to give: exit %d, want %d\n%s%s", code, exitConflict, out, errs)
	}
	if out, _, _ := m.cli(t, "build", "ls"); !strings.Contains(out, v2) {
		t.Fatalf("a refused rm removed %s:\n%s", v2, out)
	}
	if out, errs, code := m.cli(t, "rollout", "abort", "web", "--by", "alice"); code != 0 {
		t.Fatalf("abort: exit %d\n%s%s", code, out, errs)
	}
	if out, errs, code := m.cli(t, "build", "rm", v2); code != 0 || strings.Contains(errs, "warning") {
		t.Fatalf("rm once the rollout was aborted: exit %d\n%s%s", code, out, errs)
	}
}

// A want published between build rm's check and its removal (a want run
// beside rm, which found the build stored) is said once the bundle is
// removed, with exit 1 and how to mend it (a reviewer's finding: the
// window was silent); a want published before the check is refused as
// ever, and a want of another build meanwhile says nothing.
func TestBuildRmSaysAWantPublishedMeanwhile(t *testing.T) {
	// Not parallel: it sets the package-level hook buildRmChecked.
	m := startMesh(t)
	ctx := testCtx(t)
	v1, v2 := pushExe(t, m, "web", "1"), pushExe(t, m, "web", "2")
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	meanwhile := func(build string) {
		buildRmChecked = func() {
			if _, err := pub.Append(ctx, "ace", events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: build}}}, time.Now())); err != nil {
				t.Error(err)
			}
		}
		t.Cleanup(func() { buildRmChecked = func() {} })
	}
	meanwhile(v1)
	out, errs, code := m.cli(t, "build", "rm", v1)
	if code != exitError || out != "" || !strings.Contains(errs, "removed "+v1[:19]) ||
		!strings.Contains(errs, "was named while rm checked it") || !strings.Contains(errs, "1 node published a want naming it since the check began") ||
		!strings.Contains(errs, ": ace") || !strings.Contains(errs, "push it again") {
		t.Errorf("rm with a want of it published meanwhile: exit %d\n%s%s", code, out, errs)
	}
	meanwhile(v1) // ace's newest want names v1 now, not v2
	if out, errs, code := m.cli(t, "build", "rm", v2); code != 0 || strings.Contains(errs, "named while") {
		t.Errorf("rm with a want of another build meanwhile: exit %d\n%s%s", code, out, errs)
	}
}

// A build removed between want's check and its publish (a build rm run
// beside it, whose own re-read ran before the publish) is said by the
// want once published, with exit 1 and how to mend it: each side writes,
// then reads what the other wrote, so one of them says it.
func TestWantSaysABuildRemovedMeanwhile(t *testing.T) {
	// Not parallel: it sets the package-level hook wantChecked.
	m := startMesh(t)
	v1 := pushExe(t, m, "web", "1")
	wantChecked = func() {
		if _, errs, code := m.cli(t, "build", "rm", v1); code != 0 {
			t.Errorf("rm between the check and the publish: exit %d %s", code, errs)
		}
	}
	t.Cleanup(func() { wantChecked = func() {} })
	out, errs, code := m.cli(t, "want", "ace", "--new", "-f", writeWantFile(t, `{"modules":[{"name":"web","build":"`+v1+`"}]}`))
	if code != exitError || !strings.Contains(out, "want ace: stream sequence") || !strings.Contains(errs, "published, but a build was removed meanwhile") ||
		!strings.Contains(errs, "module web, build "+v1) || !strings.Contains(errs, "push it again") {
		t.Errorf("want with its build removed meanwhile: exit %d\n%s%s", code, out, errs)
	}
}
