package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestWantSaysWhichRuntimeTakesABuild: a want whose build is no bundle
// build (not sha256:…) is published with a note naming the module, that
// the process runtime cannot run it and that --runtime record takes it;
// --dry-run says the same; a want of bundle builds gets no such note (a
// reviewer's finding of issue 25: the node only failed later).
func TestWantSaysWhichRuntimeTakesABuild(t *testing.T) {
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
	for _, args := range [][]string{{"want", "ace", "-f", mixed, "--dry-run"}, {"want", "ace", "-f", mixed}} {
		_, errOut, code := m.cli(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d %s", args, code, errOut)
		}
		if !strings.Contains(errOut, "img (img:1): no bundle build") || strings.Contains(errOut, "web (") ||
			!strings.Contains(errOut, "process runtime") || !strings.Contains(errOut, "--runtime record") {
			t.Errorf("%v: stderr does not say the process runtime cannot run img:1:\n%s", args, errOut)
		}
	}
	bundles := write("bundles.json", `{"modules":[{"name":"web","build":"`+pushed+`","runs_as":"web"}]}`)
	if _, errOut, code := m.cli(t, "want", "ace", "-f", bundles); code != 0 || strings.Contains(errOut, "bundle build") {
		t.Errorf("a want of bundle builds: exit %d, stderr %q", code, errOut)
	}
}

// TestCreatedNodeHintRuns: the note after a want that created a node
// names the command that forgets it, and that command, run as printed
// (NAME filled in), is a real verb and flag and retires the node at once
// (a mistyped node has no agent to settle its empty plan).
func TestCreatedNodeHintRuns(t *testing.T) {
	m := startMesh(t)
	f := filepath.Join(t.TempDir(), "w.json")
	if err := os.WriteFile(f, []byte(`{"modules":[{"name":"idle","build":"i:1","runs_as":"idle"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := m.cli(t, "want", "typoed", "-f", f)
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
