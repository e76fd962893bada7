package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/store/auth"
)

// A provisioner client given another node's provisioner creds ends at
// once, exit 1, naming the user the creds are of and the user it runs
// as, whatever its source, as a node agent given wrong creds does
// (TestRevokedRolesExit): it retried "read the registered curve key"
// (sealed) or "read the newest knock" (a directory) for ever, the
// violation only in an async error log line (a fresh user's finding
// M1 of fresh10).
func TestProvisionerGivenAnotherNodesCredsEndsAtOnce(t *testing.T) {
	ctx := testCtx(t)
	base := t.TempDir()
	dir := filepath.Join(base, "auth")
	for _, args := range [][]string{{"auth", "init", "--dir", dir}, {"auth", "add-node", "ace", "--dir", dir}, {"auth", "add-node", "bob", "--dir", dir}} {
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
	secrets := filepath.Join(base, "secrets")
	if err := os.MkdirAll(secrets, 0o700); err != nil {
		t.Fatal(err)
	}
	creds := d.CredsPath("provisioner-ace")
	for _, from := range []string{"sealed", secrets} {
		// Without the fix it never ends: the bound lets that show as a
		// failure, not a hang.
		cctx, ccancel := context.WithTimeout(ctx, 40*time.Second)
		start := time.Now()
		code, _, errs := runCLI(cctx, "provision", "bob", "--from", from, "--account", "prov", "--trust-from", dir,
			"--key", filepath.Join(base, "curve.key"), "--server", url, "--creds", creds)
		took := time.Since(start)
		ccancel()
		if code != exitError || strings.Count(strings.TrimSpace(errs), "\n") != 0 ||
			!strings.Contains(errs, "permission denied: these credentials may not") ||
			!strings.Contains(errs, "'meshfold provision bob' runs as the provisioner role, user provisioner-bob") ||
			!strings.Contains(errs, "the creds given ("+creds+") are user provisioner-ace's, of the provisioner role") ||
			strings.Contains(errs, "retrying") {
			t.Errorf("provision bob --from %s as provisioner-ace: exit %d after %v, want %d in one line naming both users, no retry:\n%s",
				from, code, took.Round(time.Millisecond), exitError, errs)
		}
	}
}
