package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/node/bundle"
)

func TestBuildVerbs(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	dir := t.TempDir()
	exe := filepath.Join(dir, "mesh-build-go")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\nexec sleep 1000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, errs, code := m.cli(t, "build", "push", exe)
	if code != 0 {
		t.Fatalf("push: %d %s", code, errs)
	}
	build := strings.TrimSpace(out)
	if _, err := bundle.ParseBuild(build); err != nil {
		t.Fatalf("push printed %q: %v", out, err)
	}
	if !strings.Contains(errs, "manifest generated") {
		t.Errorf("push notes: %s", errs)
	}
	out2, errs, code := m.cli(t, "build", "push", exe)
	if code != 0 || strings.TrimSpace(out2) != build || !strings.Contains(errs, "already in MESH_BUILDS") {
		t.Fatalf("second push: %d %q %s", code, out2, errs)
	}
	out, _, code = m.cli(t, "build", "ls")
	if code != 0 || !strings.Contains(out, build) || !strings.Contains(out, "mesh-build-go") || !strings.Contains(out, "-- 1 in MESH_BUILDS") {
		t.Fatalf("ls: %d\n%s", code, out)
	}
	if _, errs, code = m.cli(t, "build", "rm", build); code != 0 {
		t.Fatalf("rm: %d %s", code, errs)
	}
	if _, errs, code = m.cli(t, "build", "rm", build); code != 1 || !strings.Contains(errs, "not in bucket MESH_BUILDS") {
		t.Fatalf("second rm: %d %s", code, errs)
	}
	out, _, code = m.cli(t, "build", "ls")
	if code != 0 || !strings.Contains(out, "-- 0 in MESH_BUILDS") {
		t.Fatalf("ls after rm: %d\n%s", code, out)
	}
}

func TestBuildUsageErrors(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "meshfold.json"), []byte(`{"command":["run"],"stop_signal":"SIGNOPE"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	notExec := filepath.Join(t.TempDir(), "x")
	if err := os.WriteFile(notExec, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"build", "push"}, "accepts 1 arg"},
		{[]string{"build", "push", bad}, "stop_signal"},
		{[]string{"build", "push", notExec}, "not executable"},
		{[]string{"build", "push", filepath.Join(bad, "missing")}, "cannot pack"},
		{[]string{"build", "rm", "img:sha256:abc"}, "not a bundle build"},
		{[]string{"build", "rm", "sha256:abc"}, "malformed build"},
		{[]string{"build", "ls", "extra"}, "takes no arguments"},
	} {
		_, errs, code := m.cli(t, tc.args...)
		if code != exitUsage || !strings.Contains(errs, tc.msg) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, errs, tc.msg)
		}
	}
	var out, errb strings.Builder
	if code := run(testCtx(t), []string{"build"}, nil, &out, &errb); code != exitUsage || !strings.Contains(errb.String(), "needs a subcommand") {
		t.Errorf("build alone: exit %d, %q", code, errb.String())
	}
	// Nothing was stored by the refused pushes.
	if out, _, _ := m.cli(t, "build", "ls"); !strings.Contains(out, "-- 0 in") {
		t.Errorf("ls after refusals:\n%s", out)
	}
}
