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
	"github.com/meshfold/meshfold/store"
)

// TestWantSaysWhichRuntimeTakesABuild: a want whose build is no bundle
// build (not sha256:…) is published with a note naming the module, that
// the process runtime cannot run it and that --runtime record takes it;
// --dry-run says the same; a want of bundle builds gets no such note (a
// reviewer's finding of issue 25: the node only failed later).
func TestWantSaysWhichRuntimeTakesABuild(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	dir := t.TempDir()
	exe := filepath.Join(dir, "web")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\nexec sleep 1000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := m.cli(t, "build", "push", exe)
	if code != 0 {
		t.Fatalf("push: %d %s", code, errOut)
	}
	pushed := strings.TrimSpace(out)
	write := func(name, body string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	mixed := write("mixed.json", `{"modules":[{"name":"web","build":"`+pushed+`","runs_as":"web"},{"name":"img","build":"img:1","runs_as":"img"}]}`)
	for _, args := range [][]string{{"want", "ace", "--new", "-f", mixed, "--dry-run"}, {"want", "ace", "--new", "-f", mixed}} {
		_, errOut, code := m.cli(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d %s", args, code, errOut)
		}
		if !strings.Contains(errOut, "img (img:1): no bundle build") || strings.Contains(errOut, "note: web (") ||
			!strings.Contains(errOut, "process runtime") || !strings.Contains(errOut, "--runtime record") {
			// "note: web (": the bundle build named as none (the runs_as
			// note names the module as "runs_as web (web)").
			t.Errorf("%v: stderr does not say the process runtime cannot run img:1 alone:\n%s", args, errOut)
		}
	}
	bundles := write("bundles.json", `{"modules":[{"name":"web","build":"`+pushed+`","runs_as":"web"}]}`)
	if _, errOut, code := m.cli(t, "want", "ace", "--new", "-f", bundles); code != 0 || strings.Contains(errOut, "bundle build") {
		t.Errorf("a want of bundle builds: exit %d, stderr %q", code, errOut)
	}
}

// TestCreatedNodeHintRuns: the note after a want that created a node
// names the command that forgets it, and that command, run as printed
// (NAME filled in), is a real verb and flag and retires the node at once
// (a mistyped node has no agent to settle its empty plan).
func TestCreatedNodeHintRuns(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	f := filepath.Join(t.TempDir(), "w.json")
	if err := os.WriteFile(f, []byte(`{"modules":[{"name":"idle","build":"i:1","runs_as":"idle"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := m.cli(t, "want", "typoed", "--new", "-f", f)
	if code != 0 {
		t.Fatalf("want: exit %d %s", code, errOut)
	}
	hint := regexp.MustCompile(`'meshfold (retire [^']*)'`).FindStringSubmatch(errOut)
	if hint == nil || !strings.Contains(hint[1], "--force") {
		t.Fatalf("the created-node note names no retire --force:\n%s", errOut)
	}
	args := strings.Fields(strings.ReplaceAll(hint[1], "NAME", "alice"))
	out, errOut, code := m.cli(t, args...)
	if code != 0 {
		t.Fatalf("the hinted %q: exit %d %s", hint[1], code, errOut)
	}
	out, errOut, code = m.cli(t, "state", "typoed", "-o", "json")
	if code != 0 || !strings.Contains(out, `"retired":true`) {
		t.Errorf("after the hinted retire, typoed is not retired: exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestWantRefusesUnknownNode: a want (and its dry run) for a node the
// stream holds no event of exits 2 and publishes nothing, naming --new,
// as the exit code table says; --new publishes it and says the node was
// created; a node an agent has reported (any event) takes a want without
// --new.
func TestWantRefusesUnknownNode(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	f := writeWantFile(t, goodWant)
	for _, args := range [][]string{{"want", "typoed", "-f", f}, {"want", "typoed", "-f", f, "--dry-run"}} {
		code, stdout, stderr := c.run(t, "", args...)
		if code != exitUsage || stdout != "" || !strings.Contains(stderr, "node typoed has no event in stream") ||
			!strings.Contains(stderr, "--new") || !strings.Contains(stderr, "nothing published") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 naming --new", args, code, stdout, stderr)
		}
	}
	if info, err := c.stream.Info(context.Background()); err != nil || info.State.Msgs != 0 {
		t.Fatalf("a refused want published: %v %v", info, err)
	}
	code, stdout, stderr := c.run(t, "", "want", "typoed", "-f", f, "--new")
	if code != 0 || !strings.Contains(stdout, "want typoed: stream sequence") || !strings.Contains(stderr, "created node typoed") {
		t.Fatalf("want --new: exit %d %q %q", code, stdout, stderr)
	}
	// An agent's first report makes a node known: its want needs no --new.
	pub := store.NewPublisher(c.js, c.cfg.Subjects())
	if _, err := pub.Append(context.Background(), "agented", events.Stamp(&events.Have{Modules: []events.HaveModule{}}, time.Now())); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := c.run(t, "", "want", "agented", "-f", f); code != 0 || strings.Contains(stderr, "created node") {
		t.Errorf("want of a node with a have: exit %d %q", code, stderr)
	}
}

// TestDryRunSaysRunsAs: a dry run names a module with no runs_as (an
// agent run as root refuses it) and a runs_as no module of the node's
// newest plan runs as (the node may lack that user); one whose accounts
// the node runs already says nothing of them. want says the first too.
func TestDryRunSaysRunsAs(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	if code, _, stderr := c.run(t, "", "want", "ace", "--new", "-f", writeWantFile(t, goodWant)); code != 0 {
		t.Fatalf("want: %s", stderr)
	}
	code, _, stderr := c.run(t, "", "want", "ace", "-f", writeWantFile(t, goodWant), "--dry-run")
	if code != 0 || strings.Contains(stderr, "runs_as") {
		t.Errorf("a dry run of the accounts the node runs: exit %d, stderr %q", code, stderr)
	}
	odd := writeWantFile(t, `{"modules":[{"name":"provisioner","build":"p:1","runs_as":"prov","provisioner":true},
		{"name":"bare","build":"b:1"},{"name":"web","build":"w:1","runs_as":"newuser"}]}`)
	code, _, stderr = c.run(t, "", "want", "ace", "-f", odd, "--dry-run")
	for _, s := range []string{"note: bare has no runs_as: an agent run as root refuses it", `"runs_as":"root"`,
		"note: runs_as newuser (web) is new on ace: no module of its newest plan runs as newuser", "no such user newuser on this node"} {
		if code != 0 || !strings.Contains(stderr, s) {
			t.Errorf("dry run: exit %d, stderr does not say %q:\n%s", code, s, stderr)
		}
	}
	code, _, stderr = c.run(t, "", "want", "ace", "-f", odd)
	if code != 0 || !strings.Contains(stderr, "note: bare has no runs_as") || strings.Contains(stderr, "is new on") {
		t.Errorf("want: exit %d, stderr %q", code, stderr)
	}
}
