package main

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// A verb that asks the reconciler's state only to learn whether a node
// whose events are gone is known (stateKnows) goes on when the
// credentials may not ask it: the controller role may not use the state
// service (store/auth), and `want NODE` of a node with no event failed
// with "permission denied … $MESHFOLD.mesh.state.ghost" instead of saying
// the node is unknown. Real --auth credentials, against serve --auth.
func TestStateDeniedReadsAsUnknown(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	base := t.TempDir()
	dir := filepath.Join(base, "auth")
	if code, _, errs := runCLI(ctx, "auth", "init", "--dir", dir); code != exitOK {
		t.Fatalf("auth init: %d %s", code, errs)
	}
	creds := func(user string) string { return filepath.Join(dir, "creds", user+".creds") }
	sctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	out := &lines{ch: make(chan string, 16)}
	go func() {
		defer close(done)
		if code := run(sctx, []string{"serve", "--auth", dir, "--data", filepath.Join(base, "data"), "--listen", "127.0.0.1:0", "--log-level", "warn"}, nil, out, &watchBuffer{onViolation: func() {}}); code != exitOK {
			t.Errorf("serve: exit %d", code)
		}
	}()
	t.Cleanup(func() { stop(); <-done })
	url := regexp.MustCompile(`serving NATS at (\S+);`).FindStringSubmatch(waitLine(ctx, t, out, "serving NATS at "))[1]
	as := func(user string) []string { return []string{"--server", url, "--creds", creds(user)} }
	file := writeWantFile(t, `{"modules":[{"name":"web","build":"web:1"}]}`)

	for _, c := range []struct {
		name string
		args []string
		says string // what the verb says of the unknown node
	}{
		{"want", []string{"want", "ghost", "-f", file}, "node ghost has no event in stream"},
		{"want --dry-run", []string{"want", "ghost", "-f", file, "--dry-run"}, "node ghost has no event in stream"},
		{"audit", []string{"audit", "ghost"}, "ghost"},
	} {
		t.Run(c.name, func(t *testing.T) {
			began := time.Now()
			code, stdout, errs := runCLI(ctx, append(c.args, as("controller")...)...)
			t.Logf("%s as the controller: exit %d in %s:\n%s", c.name, code, time.Since(began).Round(time.Millisecond), errs)
			if code != exitUsage || !strings.Contains(errs, c.says) || strings.Contains(errs, "permission denied") {
				t.Fatalf("exit %d, want %d saying %q with no permission error:\n%s%s", code, exitUsage, c.says, stdout, errs)
			}
			note := "meshfold: note: these credentials may not ask the reconciler's state ($MESHFOLD.mesh.state.ghost): ghost is taken as a node it does not know, as with no state service\n"
			if strings.Count(errs, "note: ") != 1 || !strings.Contains(errs, note) || strings.Contains(errs, "iolation") {
				t.Fatalf("stderr does not say once, in one line, that the state was not asked:\n%s", errs)
			}
		})
	}
	// The operator role may ask it: an unknown node is the state's
	// answer, and nothing is noted.
	code, _, errs := runCLI(ctx, append([]string{"pause", "ghost", "--by", "alice"}, as("operator")...)...)
	if code != exitUsage || strings.Contains(errs, "note:") || strings.Contains(errs, "permission denied") {
		t.Fatalf("pause as the operator: exit %d, want %d and no note:\n%s", code, exitUsage, errs)
	}
}
