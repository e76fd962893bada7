package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/store/auth"
	"github.com/meshfold/meshfold/store/embedded"
	"github.com/meshfold/meshfold/store/storetest"
)

// noteBuffer is a storetest.SyncBuffer that signals every write.
type noteBuffer struct {
	storetest.SyncBuffer
	wrote chan struct{}
}

func newNoteBuffer() *noteBuffer { return &noteBuffer{wrote: make(chan struct{}, 1)} }

func (b *noteBuffer) Write(p []byte) (int, error) {
	n, err := b.SyncBuffer.Write(p)
	select {
	case b.wrote <- struct{}{}:
	default:
	}
	return n, err
}

// waitText waits until b holds s, or ctx ends.
func (b *noteBuffer) waitText(ctx context.Context, t *testing.T, what, s string) {
	t.Helper()
	for !strings.Contains(b.String(), s) {
		select {
		case <-b.wrote:
		case <-ctx.Done():
			t.Fatalf("%s never wrote %q:\n%s", what, s, b.String())
		}
	}
}

// A node agent, a provisioner client and a console whose users are
// revoked stop with an error and a non-zero exit (their connections are
// closed for good and would never come back), so that systemd's Restart=
// starts them again.
func TestRevokedRolesExit(t *testing.T) {
	t.Parallel()
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

	type proc struct {
		name string
		out  *noteBuffer
		done chan int
	}
	start := func(name string, args ...string) *proc {
		cctx, cancel := context.WithCancel(ctx)
		p := &proc{name: name, out: newNoteBuffer(), done: make(chan int, 1)}
		go func() { p.done <- run(cctx, args, nil, p.out, p.out) }()
		t.Cleanup(func() {
			cancel()
			<-p.done
		})
		return p
	}
	serve := start("serve", "serve", "--auth", dir, "--data", filepath.Join(base, "data"), "--listen", "127.0.0.1:0", "--log-level", "warn")
	serve.out.waitText(ctx, t, "serve", "serving NATS at ")
	url := regexp.MustCompile(`serving NATS at (\S+);`).FindStringSubmatch(serve.out.String())[1]
	as := func(user string) []string { return []string{"--server", url, "--creds", d.CredsPath(user)} }
	trust := filepath.Join(dir, trustFileName)
	if err := os.MkdirAll(filepath.Join(base, "secrets"), 0o700); err != nil {
		t.Fatal(err)
	}

	node := start("node", append([]string{"node", "ace", "--runtime", "record", "--root", filepath.Join(base, "root"),
		"--state-dir", filepath.Join(base, "state"), "--trust", trust}, as("node-ace")...)...)
	prov := start("provision", append([]string{"provision", "ace", "--from", filepath.Join(base, "secrets"),
		"--account", "prov", "--trust", trust}, as("provisioner-ace")...)...)
	cons := start("console", append([]string{"console", "--listen", "127.0.0.1:0"}, as("operator-read")...)...)
	node.out.waitText(ctx, t, "node", "node agent running")
	prov.out.waitText(ctx, t, "provision", "provisioner running")
	cons.out.waitText(ctx, t, "console", "meshfold: console at http://")

	// A verb the role may not publish: explained once, with no raw log
	// lines of the violation beside it.
	if code, _, errs := runCLI(ctx, append([]string{"poke", "ace", "--by", "x", "--new"}, as("operator-read")...)...); code == exitOK ||
		strings.Count(errs, "\n") != 1 || !strings.Contains(errs, "permission denied: the operator-read role may not poke (publish to mesh.ace.poke); only the operator role may") {
		t.Errorf("poke as operator-read: exit %d, stderr %q", code, errs)
	}
	// No creds against an --auth server: the refusal says which flag and
	// which role, not only "Authorization Violation".
	if code, _, errs := runCLI(ctx, "fleet", "--server", url); code == exitOK || !strings.Contains(errs, "the server requires credentials: give a user's creds file with --creds FILE or $NATS_CREDS") ||
		!strings.Contains(errs, "operator-read for reads") {
		t.Errorf("fleet without creds: exit %d, stderr %q", code, errs)
	}

	// A node agent given another role's creds ends at once, explained,
	// naming the role the creds are of (a fresh user's finding 6: it
	// retried its lease claim every 5 s for ever).
	wrong := start("node with a provisioner's creds", append([]string{"node", "bob", "--runtime", "record", "--root", filepath.Join(base, "root-bob"),
		"--state-dir", filepath.Join(base, "state-bob"), "--trust", trust}, as("provisioner-ace")...)...)
	select {
	case code := <-wrong.done:
		wrong.done <- code // for the cleanup
		errs := wrong.out.String()
		if code != exitError || !strings.Contains(errs, "permission denied: these credentials may not") ||
			!strings.Contains(errs, "user provisioner-ace's, of the provisioner role") || !strings.Contains(errs, "'meshfold node bob' runs as the node role, user node-bob") ||
			strings.Contains(errs, "retrying") {
			t.Errorf("node bob with provisioner-ace's creds: exit %d, want %d naming the roles, no retry:\n%s", code, exitError, errs)
		}
	case <-ctx.Done():
		t.Fatalf("node bob with provisioner-ace's creds still runs:\n%s", wrong.out.String())
	}

	// A console given another role's creds ends at once, explained and
	// naming the role it reads as, exit 1 as the node's (a fresh user's
	// finding L12: it exited 1 with "snapshot bucket MESH_SNAPSHOTS:
	// context deadline exceeded", the cause only in a WARN line).
	wrongConsole := start("console with a node's creds", append([]string{"console", "--listen", "127.0.0.1:0"}, as("node-ace")...)...)
	select {
	case code := <-wrongConsole.done:
		wrongConsole.done <- code // for the cleanup
		errs := wrongConsole.out.String()
		if code != exitError || !strings.Contains(errs, "meshfold console (") || !strings.Contains(errs, "permission denied: these credentials may not") ||
			!strings.Contains(errs, "user node-ace's, of the node role") || !strings.Contains(errs, "'meshfold console' reads as the operator-read role") ||
			strings.Contains(errs, "deadline exceeded") {
			t.Errorf("console with node-ace's creds: exit %d, want %d naming the roles:\n%s", code, exitError, errs)
		}
	case <-ctx.Done():
		t.Fatalf("console with node-ace's creds still runs:\n%s", wrongConsole.out.String())
	}

	for _, user := range []string{"node-ace", "provisioner-ace", "operator-read"} {
		args := append([]string{"auth", "revoke", user, "--dir", dir}, as(auth.SystemUser)...)
		if code, out, errs := runCLI(ctx, args...); code != exitOK || !strings.Contains(out, "jwt updated") {
			t.Fatalf("auth revoke %s: %d %s %s", user, code, out, errs)
		}
	}
	for _, p := range []*proc{node, prov, cons} {
		select {
		case code := <-p.done:
			p.done <- code // for the cleanup
			if code == exitOK || !strings.Contains(p.out.String(), "meshfold: NATS connection closed for good: its credentials were revoked or are not accepted (") {
				t.Errorf("%s after its user's revocation: exit %d, want an error saying the connection closed for good:\n%s", p.name, code, p.out.String())
			}
		case <-ctx.Done():
			t.Fatalf("%s still runs after its user's revocation:\n%s", p.name, p.out.String())
		}
	}
}

// A reconciler whose user is revoked stops with an error and a non-zero
// exit, as the node agent does: `meshfold reconcile` alone and in a
// group, against a server of the auth directory, and `meshfold serve
// --auth`, whose in-process reconciler connects as the same user.
func TestRevokedReconcilerExits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		group bool // reconcile --group
		serve bool // serve --auth instead of reconcile
	}{{name: "reconcile"}, {name: "reconcile --group", group: true}, {name: "serve", serve: true}} {
		t.Run(tc.name, func(t *testing.T) {
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
			done := make(chan int, 1)
			start := func(args ...string) {
				cctx, cancel := context.WithCancel(ctx)
				go func() { done <- run(cctx, args, nil, out, out) }()
				t.Cleanup(func() {
					cancel()
					<-done
				})
			}
			var url string
			if tc.serve {
				start("serve", "--auth", dir, "--data", filepath.Join(base, "data"), "--listen", "127.0.0.1:0", "--log-level", "warn")
				out.waitText(ctx, t, tc.name, "serving NATS at ")
				url = regexp.MustCompile(`serving NATS at (\S+);`).FindStringSubmatch(out.String())[1]
			} else {
				sa, err := d.ServerAuth()
				if err != nil {
					t.Fatal(err)
				}
				srv, err := embedded.Start(embedded.Config{DataDir: filepath.Join(base, "data"), Listen: "127.0.0.1:0", Auth: sa})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(srv.Shutdown)
				url = srv.ClientURL()
				args := []string{"reconcile", "--server", url, "--creds", d.CredsPath(string(auth.RoleReconciler)),
					"--signing-key", filepath.Join(base, signingKeyFile), "--log-level", "warn"}
				if tc.group {
					args = append(args, "--group", "g", "--instance", "a")
				}
				start(args...)
				out.waitText(ctx, t, tc.name, "reconciling stream ")
			}

			args := []string{"auth", "revoke", string(auth.RoleReconciler), "--dir", dir, "--server", url, "--creds", d.CredsPath(auth.SystemUser)}
			code, o, errs := runCLI(ctx, args...)
			// serve's server stops with it: serve may exit before the
			// server replies to the push that revoked its reconciler,
			// and auth revoke then says the push failed though it took
			// effect.
			cutOff := tc.serve && strings.Contains(errs, "but the push failed")
			if !cutOff && (code != exitOK || !strings.Contains(o, "jwt updated")) {
				t.Fatalf("auth revoke reconciler: %d %s %s\n%s said:\n%s", code, o, errs, tc.name, out.String())
			}
			select {
			case code := <-done:
				done <- code // for the cleanup
				if code != exitError || !strings.Contains(out.String(), "meshfold: NATS connection closed for good") {
					t.Errorf("%s after its user's revocation: exit %d, want %d and an error saying the connection closed for good:\n%s", tc.name, code, exitError, out.String())
				}
			case <-ctx.Done():
				t.Fatalf("%s still runs after its user's revocation:\n%s", tc.name, out.String())
			}
		})
	}
}
