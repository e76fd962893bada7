package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/store/auth"
	"github.com/meshfold/meshfold/store/embedded"
)

// A fresh user's finding F12: `auth revoke controller` (a rotation) on
// serve --auth left its rollout controller on a closed connection: a WARN
// "rollout controller stopped; starting again … connection closed" every
// second for ever, nothing saying "revoked", and the user issued again
// changed nothing until serve restarted. Now one ERROR names the
// revocation and the fix, and once the user is issued again the
// controller runs with the new creds: a rollout applied after the
// re-issue completes, serve never restarted.
func TestServeControllerUserRevokedAndIssuedAgain(t *testing.T) {
	t.Parallel()
	testControllerUserRevokedAndIssuedAgain(t, false)
}

// reconcile --controller-creds FILE did the same (a reviewer's finding):
// a WARN every second for ever after the revocation. Now it stops as
// serve's does, one ERROR, and reads FILE again when it changes: the
// re-issued user's creds copied over it, the controller runs again,
// reconcile never restarted.
func TestReconcileControllerCredsRevokedAndRewritten(t *testing.T) {
	t.Parallel()
	testControllerUserRevokedAndIssuedAgain(t, true)
}

func testControllerUserRevokedAndIssuedAgain(t *testing.T, reconcile bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	base := t.TempDir()
	dir := filepath.Join(base, "auth")
	nodes := []string{"ace", "bob", "cat"}
	for _, args := range [][]string{{"auth", "init", "--dir", dir}, {"auth", "add-node", "ace", "--dir", dir},
		{"auth", "add-node", "bob", "--dir", dir}, {"auth", "add-node", "cat", "--dir", dir}} {
		if code, _, errs := runCLI(ctx, args...); code != exitOK {
			t.Fatalf("%v: %d %s", args, code, errs)
		}
	}
	creds := func(user string) string { return filepath.Join(dir, "creds", user+".creds") }
	var stops []func()
	t.Cleanup(func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	})
	background := func(name string, out *noteBuffer, args ...string) {
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = run(cctx, args, nil, out, out)
		}()
		stops = append(stops, func() {
			cancel()
			<-done
			if t.Failed() {
				t.Logf("%s said:\n%s", name, out.String())
			}
		})
	}
	serve := newNoteBuffer() // serve's or reconcile's log
	var url string
	ctlCreds := filepath.Join(base, "controller.creds") // reconcile's --controller-creds
	if reconcile {
		d, err := auth.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
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
		copyFile(t, creds("controller"), ctlCreds)
		background("reconcile", serve, "reconcile", "--server", url, "--creds", creds("reconciler"),
			"--controller-creds", ctlCreds, "--signing-key", filepath.Join(dir, signingKeyFile), "--log-level", "info")
		serve.waitText(ctx, t, "reconcile", "reconciling stream ")
	} else {
		background("serve", serve, "serve", "--auth", dir, "--data", filepath.Join(base, "data"), "--listen", "127.0.0.1:0", "--log-level", "info")
		serve.waitText(ctx, t, "serve", "serving NATS at ")
		url = regexp.MustCompile(`serving NATS at (\S+);`).FindStringSubmatch(serve.String())[1]
	}
	as := func(user string) []string { return []string{"--server", url, "--creds", creds(user)} }
	trust := filepath.Join(dir, trustFileName)
	for _, n := range nodes {
		background("node "+n, newNoteBuffer(), append([]string{"node", n, "--runtime", "record", "--log-level", "warn",
			"--root", filepath.Join(base, n+"-root"), "--state-dir", filepath.Join(base, n+"-state"), "--trust", trust}, as("node-"+n)...)...)
		if code, out, errs := runCLI(ctx, append([]string{"want", n, "--new", "-f", writeWantFile(t, `{"modules":[{"name":"web","build":"web:1"}]}`)}, as("controller")...)...); code != exitOK {
			t.Fatalf("want %s: %d %s %s", n, code, out, errs)
		}
	}

	// The rotation: revoked (pushed to serve's server), then issued again.
	if code, out, errs := runCLI(ctx, append([]string{"auth", "revoke", "controller", "--dir", dir}, "--server", url)...); code != exitOK {
		t.Fatalf("auth revoke controller: %d %s %s", code, out, errs)
	}
	serve.waitText(ctx, t, "serve", "rollout controller stopped: its user was revoked")
	if code, out, errs := runCLI(ctx, "auth", "add-user", "controller", "--dir", dir); code != exitOK {
		t.Fatalf("auth add-user controller: %d %s %s", code, out, errs)
	}
	if reconcile {
		copyFile(t, creds("controller"), ctlCreds)
		serve.waitText(ctx, t, "reconcile", "rollout controller: its creds file "+ctlCreds+" changed")
	} else {
		serve.waitText(ctx, t, "serve", "rollout controller: its user was issued again")
	}

	file := filepath.Join(base, "fleet.yaml")
	if err := os.WriteFile(file, []byte(strings.Replace(fleetYAML, "canary: 1, ", "", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := runCLI(ctx, append([]string{"apply", "-f", file, "--by", "alice"}, as("operator")...)...); code != exitOK {
		t.Fatalf("apply: %d %s %s", code, out, errs)
	}
	var v rollout.View
	waitfor.Value(t, 2*time.Minute, "the rollout completed", func() (string, bool) {
		code, out, errs := runCLI(ctx, append([]string{"rollout", "status", "web", "-o", "json"}, as("operator-read")...)...)
		if code != exitOK {
			return fmt.Sprintf("code %d\n%s%s", code, out, errs), false
		}
		v = rollout.View{}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("status -o json: %v\n%s", err, out)
		}
		return out, v.Phase == rollout.Completed || v.Phase == rollout.Halted
	})
	if v.Phase != rollout.Completed {
		t.Fatalf("rollout %s, want completed: halt %+v", v.Phase, v.Halt)
	}
	log := serve.String()
	if n := strings.Count(log, "its user was revoked"); n != 1 {
		t.Errorf("%d ERRORs naming the revocation, want 1", n)
	}
	if n := strings.Count(log, "starting again"); n > 3 {
		t.Errorf("%d lines 'starting again': the controller retried its closed connection", n)
	}
}

// copyFile copies the file from to to, as an operator's cp does.
func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
