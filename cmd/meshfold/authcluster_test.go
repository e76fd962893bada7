package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
)

// resolverCluster starts three nats-server (n1, n2, n3) in this process,
// a JetStream cluster whose routes listen on 127.0.0.1:routeBase+1..3,
// each including its own resolver.conf of d (a full resolver), as
// docs/operations.md configures them. It returns them once a meta
// leader is elected.
func resolverCluster(t *testing.T, ctx context.Context, d *auth.Dir, routeBase int) []*server.Server {
	t.Helper()
	var routes []string
	for i := 1; i <= 3; i++ {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", routeBase+i))
	}
	var srvs []*server.Server
	for i := 1; i <= 3; i++ {
		work := t.TempDir()
		rc, err := d.ResolverConfigFor(filepath.Join(work, "jwt"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(work, "resolver.conf"), []byte(rc), 0o644); err != nil {
			t.Fatal(err)
		}
		conf := fmt.Sprintf("server_name: n%d\nhost: 127.0.0.1\nport: -1\njetstream: {store_dir: %q}\n"+
			"cluster: {name: mesh, host: 127.0.0.1, port: %d, routes: [%s]}\ninclude \"resolver.conf\"\n",
			i, filepath.Join(work, "js"), routeBase+i, strings.Join(routes, ", "))
		if err := os.WriteFile(filepath.Join(work, "nats-server.conf"), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		opts, err := server.ProcessConfigFile(filepath.Join(work, "nats-server.conf"))
		if err != nil {
			t.Fatal(err)
		}
		opts.NoLog, opts.NoSigs = true, true
		srv, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		srv.Start()
		t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
		srvs = append(srvs, srv)
	}
	for _, s := range srvs {
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatalf("%s not ready", s.Name())
		}
	}
	waitMetaLeader(t, ctx, srvs)
	return srvs
}

// waitMetaLeader waits until one of srvs leads the JetStream meta group.
func waitMetaLeader(t *testing.T, ctx context.Context, srvs []*server.Server) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, s := range srvs {
			if s.Running() && s.JetStreamIsLeader() {
				return
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal("no JetStream meta leader")
		}
	}
}

// auth revoke against a cluster says what every server answered, and
// exits 1 naming a server that is down (it has not applied the
// revocation) with what to do about it.
func TestAuthRevokeReportsEveryServer(t *testing.T) {
	// Not parallel: its cluster routes on fixed ports (45310 on).
	ctx := testCtx(t)
	dir := filepath.Join(t.TempDir(), "auth")
	for _, args := range [][]string{{"auth", "init", "--dir", dir}, {"auth", "add-node", "ace", "--dir", dir}, {"auth", "add-node", "bob", "--dir", dir}, {"auth", "add-node", "cat", "--dir", dir}} {
		if code, _, errs := runCLI(ctx, args...); code != exitOK {
			t.Fatalf("%v: %d %s", args, code, errs)
		}
	}
	d, err := auth.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	srvs := resolverCluster(t, ctx, d, 45310)

	// All three up: three answers, exit 0, as soon as the last one
	// answered (the wait is long for a loaded machine, not waited out).
	start := time.Now()
	code, out, errs := runCLI(ctx, "auth", "revoke", "node-ace", "--dir", dir, "--server", srvs[0].ClientURL(), "--wait", "20s")
	t.Logf("every server up (%v):\n%s", time.Since(start).Round(time.Millisecond), out)
	if code != exitOK {
		t.Fatalf("auth revoke node-ace: %d %s %s", code, out, errs)
	}
	for _, want := range []string{"pushed to 3 servers:", "n1: jwt updated", "n2: jwt updated", "n3: jwt updated"} {
		if !strings.Contains(out, want) {
			t.Errorf("auth revoke node-ace with every server up said\n%s\nwant a line %q", out, want)
		}
	}
	for _, s := range srvs {
		nc, err := store.Connect(store.ConnectConfig{URLs: []string{s.ClientURL()}, Creds: d.CredsPath("node-ace"), Name: "node-ace"})
		if err == nil {
			nc.Close()
			t.Errorf("%s accepts the revoked node-ace", s.Name())
		}
	}

	// n3 down: n1 and n2 apply it, n3 is reported without an answer.
	srvs[2].Shutdown()
	srvs[2].WaitForShutdown()
	waitMetaLeader(t, ctx, srvs[:2])
	start = time.Now()
	code, out, errs = runCLI(ctx, "auth", "revoke", "node-bob", "--dir", dir, "--server", srvs[0].ClientURL(), "--wait", "5s")
	t.Logf("n3 down (%v):\n%s%s", time.Since(start).Round(time.Millisecond), out, errs)
	if code != exitError {
		t.Errorf("auth revoke node-bob with n3 down: exit %d, want %d", code, exitError)
	}
	for _, want := range []string{"pushed to 3 servers:", "n1: jwt updated", "n2: jwt updated",
		"n3: no answer (offline? once it restarts it refuses node-bob within its resolver interval, 10 s; or copy " + filepath.Join(dir, "resolver.conf") + " to it)"} {
		if !strings.Contains(out, want) {
			t.Errorf("auth revoke node-bob with n3 down said\n%s\nwant a line %q", out, want)
		}
	}
	if !strings.Contains(errs, "1 of 3 servers did not apply it: n3") {
		t.Errorf("auth revoke node-bob with n3 down: stderr %q, want it to name n3", errs)
	}

	// n2 down too: n1 alone has no meta leader to name the others (or
	// still leads and names them); either way both are counted missing.
	srvs[1].Shutdown()
	srvs[1].WaitForShutdown()
	code, out, errs = runCLI(ctx, "auth", "revoke", "node-cat", "--dir", dir, "--server", srvs[0].ClientURL(), "--wait", "5s")
	t.Logf("n2, n3 down:\n%s%s", out, errs)
	if code != exitError || !strings.Contains(out, "pushed to 3 servers:") || !strings.Contains(out, "n1: jwt updated") ||
		!strings.Contains(errs, "2 of 3 servers did not apply it") {
		t.Errorf("auth revoke node-cat with n2, n3 down: exit %d\n%s%s\nwant exit %d, 3 servers, n1 applied it, 2 did not", code, out, errs, exitError)
	}
}
