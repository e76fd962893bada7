package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store/auth"
)

// The controller dry-runs its own want (a CI job checks a want before
// it publishes it): `want --dry-run` with the controller's creds prints
// the plan, as with the operator's, instead of "may not publish to
// $JS.API.STREAM.INFO.KV_MESH_SNAPSHOTS" after 2.3 s (a fresh user's
// finding M12). Controller creds issued by the build before the grant
// are refused at once, told to issue them again.
func TestControllerDryRun(t *testing.T) {
	t.Parallel()
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
	ctl := d.CredsPath("controller")
	f := writeWantFile(t, goodWant)
	if code, _, errs := runCLI(ctx, "want", "ace", "--new", "-f", f, "--server", url, "--creds", ctl); code != exitOK {
		t.Fatalf("want ace --new as the controller: %d %s", code, errs)
	}

	code, stdout, errs := runCLI(ctx, "want", "ace", "-f", f, "--dry-run", "--server", url, "--creds", ctl)
	if code != exitOK || !strings.Contains(stdout, "dry run of a want for ace") || strings.Contains(errs, "permission") {
		t.Fatalf("want ace --dry-run as the controller: exit %d\nstdout: %s\nstderr: %s", code, stdout, errs)
	}

	// The controller's creds as the build before issued them: this
	// build's permissions without the dry run's grants, signed by the
	// mesh account, so the server takes them.
	perms, err := auth.Permissions(auth.RoleController, "", auth.Names{})
	if err != nil {
		t.Fatal(err)
	}
	perms.Pub.Allow = slices.DeleteFunc(slices.Clone(perms.Pub.Allow), func(s string) bool {
		return strings.Contains(s, "SNAPSHOTS") || s == events.StateSubject("", events.EndpointFold, "*")
	})
	older := filepath.Join(t.TempDir(), "controller.creds")
	writeAccountCreds(t, filepath.Join(dir, "accounts", auth.MeshAccountName+".nk"), older, "controller", perms)
	cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
	defer ccancel()
	start := time.Now()
	code, _, errs = runCLI(cctx, "want", "ace", "-f", f, "--dry-run", "--server", url, "--creds", older)
	took := time.Since(start)
	for _, want := range []string{
		"the controller role may in this build, but the creds given (" + older + ", user controller's) were issued by an older build",
		"meshfold auth revoke controller --dir DIR, then meshfold auth add-user controller --dir DIR",
	} {
		if code != exitError || !strings.Contains(errs, want) {
			t.Errorf("dry run with older controller creds: exit %d after %v, stderr %q; want exit %d with %q", code, took, errs, exitError, want)
		}
	}
	t.Logf("older creds refused after %v", took)
}

// writeAccountCreds writes a creds file of a user named name with perms,
// signed by the account whose seed is at seedPath: creds the server takes.
func writeAccountCreds(t *testing.T, seedPath, path, name string, perms jwt.Permissions) {
	t.Helper()
	seed, err := os.ReadFile(seedPath)
	if err != nil {
		t.Fatal(err)
	}
	akp, err := nkeys.FromSeed(bytes.TrimSpace(seed))
	if err != nil {
		t.Fatal(err)
	}
	ukp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	upub, _ := ukp.PublicKey()
	useed, _ := ukp.Seed()
	uc := jwt.NewUserClaims(upub)
	uc.Name = name
	uc.Permissions = perms
	tok, err := uc.Encode(akp)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(tok, useed)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
}
