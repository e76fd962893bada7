package main

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/store/auth"
)

// A role started with creds that may not open its buckets ends at once
// with the permission explained: the server answers a denied JetStream
// request with no reply, which the bucket open took for a leader's
// election and asked again, `reconcile` with a controller's creds for
// its whole 30 s before saying "stream KV_MESH_NODES has no leader", a
// provisioner with a node's creds for ever (its open retried without
// end).
func TestRoleDeniedItsBucketsEndsAtOnce(t *testing.T) {
	// Not parallel: it times the exit.
	ctx := testCtx(t)
	base := t.TempDir()
	dir := filepath.Join(base, "auth")
	for _, args := range [][]string{{"auth", "init", "--dir", dir}, {"auth", "add-node", "ace", "--dir", dir}} {
		if code, _, errs := runCLI(ctx, args...); code != exitOK {
			t.Fatalf("%v: %d %s", args, code, errs)
		}
	}
	d, err := auth.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := newNoteBuffer()
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan int, 1)
	go func() {
		done <- run(sctx, []string{"serve", "--auth", dir, "--data", filepath.Join(base, "data"), "--listen", "127.0.0.1:0", "--log-level", "warn"}, nil, out, out)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	out.waitText(ctx, t, "serve", "serving NATS at ")
	url := regexp.MustCompile(`serving NATS at (\S+);`).FindStringSubmatch(out.String())[1]

	// Well under one ask's 5 s and the 30 s bound; the server says the
	// denial within milliseconds (10 ms measured).
	const within = 5 * time.Second
	for _, tc := range []struct {
		user string
		args []string
		want string
	}{
		{"controller", []string{"reconcile", "--signing-key", filepath.Join(dir, "reconciler-signing.nk")}, "permission denied: these credentials may not publish to $JS.API.STREAM.INFO.KV_MESH_"},
		{"node-ace", []string{"provision", "ace", "--from", "sealed", "--account", "prov", "--trust-from", dir, "--key", filepath.Join(base, "curve.key")},
			"permission denied: these credentials may not publish to $JS.API.STREAM.INFO.KV_MESH_SECRETS; 'meshfold provision ace' runs as the provisioner role, user provisioner-ace"},
	} {
		// Without the fix, reconcile ends at the 30 s bound and provision
		// not at all: 40 s lets either show as too slow, not hang.
		cctx, ccancel := context.WithTimeout(ctx, 40*time.Second)
		start := time.Now()
		code, _, errs := runCLI(cctx, append(tc.args, "--server", url, "--creds", d.CredsPath(tc.user))...)
		took := time.Since(start)
		ccancel()
		if code != exitError || !strings.Contains(errs, tc.want) {
			t.Errorf("%s as %s: exit %d after %v, stderr %q; want exit %d with %q", tc.args[0], tc.user, code, took, errs, exitError, tc.want)
			continue
		}
		if took > within {
			t.Errorf("%s as %s: refused after %v, want within %v", tc.args[0], tc.user, took, within)
		}
	}
}
