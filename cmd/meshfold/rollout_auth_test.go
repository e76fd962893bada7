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
	"github.com/meshfold/meshfold/store/storetest"
)

// A rollout under auth: the controller of serve --auth, and of reconcile
// --controller-creds, publishes the wants as the directory's controller
// user (the reconciler's user may not), and a rollout over three
// recording agents completes, every component within its user's
// permissions (a violation in any log ends the test).
func TestRolloutWithCredentials(t *testing.T) {
	t.Parallel()
	t.Run("serve", func(t *testing.T) { testRolloutWithCredentials(t, false) })
	t.Run("reconcile", func(t *testing.T) { testRolloutWithCredentials(t, true) })
}

func testRolloutWithCredentials(t *testing.T, reconcile bool) {
	ctx, refused := context.WithCancel(testCtx(t))
	defer refused()
	base := t.TempDir()
	dir := filepath.Join(base, "auth")
	nodes := []string{"ace", "bob", "cat"}
	for _, args := range [][]string{{"auth", "init", "--dir", dir}, append([]string{"auth", "add-node", "--dir", dir}, nodes[0])} {
		if code, _, errs := runCLI(ctx, args...); code != exitOK {
			t.Fatalf("%v: %d %s", args, code, errs)
		}
	}
	for _, n := range nodes[1:] {
		if code, _, errs := runCLI(ctx, "auth", "add-node", n, "--dir", dir); code != exitOK {
			t.Fatalf("auth add-node %s: %d %s", n, code, errs)
		}
	}
	creds := func(user string) string { return filepath.Join(dir, "creds", user+".creds") }

	var stops []func()
	t.Cleanup(func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	})
	background := func(name string, stdout *lines, args ...string) {
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		errb := &watchBuffer{onViolation: refused}
		go func() {
			defer close(done)
			if code := run(cctx, append(args, "--log-level", "warn"), nil, stdout, errb); code != exitOK {
				t.Errorf("%s: exit %d: %s", name, code, errb.String())
			}
		}()
		stops = append(stops, func() {
			cancel()
			<-done
			if s := errb.String(); strings.Contains(s, "iolation") || strings.Contains(s, "rollouts are off") {
				t.Errorf("%s:\n%s", name, s)
			}
		})
	}

	var url string
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
		out := &lines{ch: make(chan string, 16)}
		background("reconcile", out, "reconcile", "--server", url, "--creds", creds("reconciler"),
			"--controller-creds", creds("controller"), "--signing-key", filepath.Join(dir, signingKeyFile))
		waitLine(ctx, t, out, "reconciling stream ")
	} else {
		out := &lines{ch: make(chan string, 16)}
		background("serve", out, "serve", "--auth", dir, "--data", filepath.Join(base, "data"), "--listen", "127.0.0.1:0")
		m := regexp.MustCompile(`serving NATS at (\S+);`).FindStringSubmatch(waitLine(ctx, t, out, "serving NATS at "))
		url = m[1]
	}
	as := func(user string) []string { return []string{"--server", url, "--creds", creds(user)} }
	trust := filepath.Join(dir, trustFileName)
	for _, n := range nodes {
		background("node "+n, &lines{ch: make(chan string)}, append([]string{"node", n, "--runtime", "record",
			"--root", filepath.Join(base, n+"-root"), "--state-dir", filepath.Join(base, n+"-state"), "--trust", trust}, as("node-"+n)...)...)
		if code, out, errs := runCLI(ctx, append([]string{"want", n, "--new", "-f", writeWantFile(t, `{"modules":[{"name":"web","build":"web:1"}]}`)}, as("controller")...)...); code != exitOK {
			t.Fatalf("want %s: %d %s %s", n, code, out, errs)
		}
	}

	file := filepath.Join(base, "fleet.yaml")
	fleet := strings.Replace(fleetYAML, "canary: 1, ", "", 1) // no promote to wait for
	if err := os.WriteFile(file, []byte(fleet), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := runCLI(ctx, append([]string{"apply", "-f", file, "--by", "alice"}, as("operator")...)...); code != exitOK {
		t.Fatalf("apply: %d %s %s", code, out, errs)
	}
	var v rollout.View
	waitfor.Value(t, 60*time.Second, "the rollout completed", func() (string, bool) {
		if ctx.Err() != nil {
			t.Fatal("a component was refused something (see its log below)")
		}
		code, out, errs := runCLI(ctx, append([]string{"rollout", "status", "web", "-o", "json"}, as("operator-read")...)...)
		if code != exitOK {
			return fmt.Sprintf("code %d\n%s%s", code, out, errs), false
		}
		v = rollout.View{}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("status -o json: %v\n%s", err, out)
		}
		return out, v.Phase == rollout.Completed || v.Phase == rollout.Halted || v.Phase == rollout.WaitingPromote
	})
	if v.Phase != rollout.Completed || len(v.Targets) != len(nodes) {
		t.Fatalf("rollout %s with %d targets, want completed with %d: halt %+v", v.Phase, len(v.Targets), len(nodes), v.Halt)
	}
	for _, tg := range v.Targets {
		if tg.Published == 0 || !tg.Settled {
			t.Errorf("target %s: want published at %d, settled %v", tg.Node, tg.Published, tg.Settled)
		}
	}
}

// waitLine returns the first line out prints that contains text; no such
// line by ctx's end fails the test. The lines before it are dropped.
func waitLine(ctx context.Context, t *testing.T, out *lines, text string) string {
	t.Helper()
	for {
		select {
		case l := <-out.ch:
			if strings.Contains(l, text) {
				return l
			}
		case <-ctx.Done():
			t.Fatalf("no line with %q", text)
		}
	}
}

// reconcile connected with credentials and without --controller-creds
// says at start that rollouts are off in it, and why.
func TestReconcileWithoutControllerCreds(t *testing.T) {
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
	sa, err := d.ServerAuth()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := embedded.Start(embedded.Config{DataDir: filepath.Join(base, "data"), Listen: "127.0.0.1:0", Auth: sa})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	cctx, cancel := context.WithCancel(ctx)
	out := &lines{ch: make(chan string, 16)}
	done := make(chan int, 1)
	go func() {
		done <- run(cctx, []string{"reconcile", "--server", srv.ClientURL(), "--creds", d.CredsPath(string(auth.RoleReconciler)),
			"--signing-key", filepath.Join(dir, signingKeyFile), "--log-level", "error"}, nil, out, &storetest.SyncBuffer{})
	}()
	l := waitLine(ctx, t, out, "rollouts are off")
	cancel()
	if code := <-done; code != exitOK {
		t.Errorf("reconcile: exit %d", code)
	}
	if !strings.Contains(l, "--controller-creds") {
		t.Errorf("the note does not say what to give: %s", l)
	}
}

// serve --auth over a directory whose controller user is revoked starts,
// saying that rollouts are off and how to issue the user again.
func TestServeWithoutControllerUser(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	base := t.TempDir()
	dir := filepath.Join(base, "auth")
	for _, args := range [][]string{{"auth", "init", "--dir", dir}, {"auth", "revoke", "controller", "--dir", dir, "--no-push"}} {
		if code, _, errs := runCLI(ctx, args...); code != exitOK {
			t.Fatalf("%v: %d %s", args, code, errs)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	out := &lines{ch: make(chan string, 16)}
	done := make(chan int, 1)
	go func() {
		done <- run(cctx, []string{"serve", "--auth", dir, "--data", filepath.Join(base, "data"), "--listen", "127.0.0.1:0",
			"--log-level", "error"}, nil, out, &storetest.SyncBuffer{})
	}()
	l := waitLine(ctx, t, out, "rollouts are off")
	cancel()
	if code := <-done; code != exitOK {
		t.Errorf("serve: exit %d", code)
	}
	if !strings.Contains(l, "meshfold auth add-user controller --dir "+dir) {
		t.Errorf("the note does not say how to issue the user: %s", l)
	}
}
