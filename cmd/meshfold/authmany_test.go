package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// auth add-node takes many names: each node's two users in one call,
// and a refusal of one name issues none (a fresh user's finding M1: one
// call per node, 31.5 s for 300).
func TestAuthAddNodeMany(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "auth")
	if code, _, errs := runCLI(ctx, "auth", "init", "--dir", dir); code != exitOK {
		t.Fatalf("auth init: %d %s", code, errs)
	}
	code, out, errs := runCLI(ctx, "auth", "add-node", "n001", "n002", "n003", "--dir", dir)
	if code != exitOK {
		t.Fatalf("auth add-node n001 n002 n003: %d %s %s", code, out, errs)
	}
	for _, u := range []string{"node-n001", "provisioner-n001", "node-n002", "node-n003", "provisioner-n003"} {
		if !strings.Contains(out, filepath.Join(dir, "creds", u+".creds")) {
			t.Errorf("auth add-node of three does not name %s's creds:\n%s", u, out)
		}
	}
	if code, _, errs := runCLI(ctx, "auth", "add-node", "n004", "n002", "--dir", dir); code != exitUsage || !strings.Contains(errs, "n002") {
		t.Errorf("auth add-node over an existing node: %d %s, want a usage error naming n002", code, errs)
	}
	if code, _, errs := runCLI(ctx, "auth", "add-node", "n004", "N5!", "--dir", dir); code != exitUsage || !strings.Contains(errs, "N5!") {
		t.Errorf("auth add-node with a bad name among good ones: %d %s, want a usage error naming it", code, errs)
	}
	if code, out, errs := runCLI(ctx, "auth", "add-node", "n004", "--dir", dir); code != exitOK || !strings.Contains(out, "node-n004") {
		t.Errorf("auth add-node n004 after two refused calls naming it: %d %s %s, want it issued (the refusals issued nothing)", code, out, errs)
	}
}
