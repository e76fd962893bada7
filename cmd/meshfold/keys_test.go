package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
	"github.com/meshfold/meshfold/store/storetest"
)

// The embedded default needs no extra step for signing: serve prints its
// key and writes the trust file a local node agent reads by default, and
// `meshfold node` without --trust applies the reconciler's signed plans.
func TestServeThenNodeNeedsNoTrustFlag(t *testing.T) {
	t.Setenv("XDG_STATE_HOME", t.TempDir()) // this test's own trust file
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	base := t.TempDir()
	serveOut := &lines{ch: make(chan string, 8)}
	served := make(chan int, 1)
	go func() {
		served <- run(ctx, []string{"serve", "--data", filepath.Join(base, "data"), "--listen", "127.0.0.1:0", "--log-level", "warn"},
			nil, serveOut, &storetest.SyncBuffer{})
	}()
	next := func() string {
		select {
		case l := <-serveOut.ch:
			return l
		case <-ctx.Done():
			t.Fatal("serve printed nothing")
			return ""
		}
	}
	url := regexp.MustCompile(`serving NATS at (\S+);`).FindStringSubmatch(next())[1]
	keyLine, trustLine := next(), next()
	key := regexp.MustCompile(`signed with a new key, (N[A-Z0-9]+)`).FindStringSubmatch(keyLine)
	if key == nil {
		t.Fatalf("serve's key line: %q", keyLine)
	}
	wantTrust, _ := defaultTrustFile()
	if !strings.Contains(trustLine, wantTrust) {
		t.Fatalf("serve's trust line %q does not name %s", trustLine, wantTrust)
	}
	if trust, err := store.ReadTrustFile(wantTrust); err != nil || len(trust.Keys()) != 1 || trust.Keys()[0] != key[1] {
		t.Fatalf("trust file: %v %v, want the key %s", trust.Keys(), err, key[1])
	}

	root := filepath.Join(base, "root")
	nodeErr := &storetest.SyncBuffer{}
	noded := make(chan int, 1)
	go func() {
		noded <- run(ctx, []string{"node", "ace", "--root", root, "--state-dir", filepath.Join(base, "state"), "-s", url, "--runtime", "record"},
			nil, &storetest.SyncBuffer{}, nodeErr)
	}()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	_, cfg, err := store.OpenStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	want := events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "app", Build: "a:1"}}}, time.Now())
	if _, err := store.NewPublisher(js, cfg.Subjects()).Append(ctx, "ace", want); err != nil {
		t.Fatal(err)
	}
	record := filepath.Join(root, ".meshfold", "modules", "app.json")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node said:\n%s", nodeErr.String())
		}
	})
	pollUntil(t, "the node to apply the signed plan", func() bool { _, err := os.Stat(record); return err == nil })
	if strings.Contains(nodeErr.String(), "plan refused") {
		t.Errorf("the node refused a plan:\n%s", nodeErr.String())
	}
	cancel()
	for _, ch := range []chan int{noded, served} {
		if code := <-ch; code != exitOK {
			t.Errorf("exit %d; node said:\n%s", code, nodeErr.String())
		}
	}
}

// auth rotate-reconciler: a new key, the old one retired, and an overlap
// where the trust file names both; --finish ends it.
func TestAuthRotateReconciler(t *testing.T) {
	ctx := testCtx(t)
	dir := filepath.Join(t.TempDir(), "auth")
	if code, _, errs := runCLI(ctx, "auth", "init", "--dir", dir); code != exitOK {
		t.Fatalf("auth init: %d %s", code, errs)
	}
	d, err := auth.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	first, err := store.ReadTrustFile(d.TrustPath())
	if err != nil || len(first.Keys()) != 1 {
		t.Fatalf("auth init's trust file: %v %v, want one key", first.Keys(), err)
	}
	old := first.Keys()[0]
	code, out, errs := runCLI(ctx, "auth", "rotate-reconciler", "--dir", dir)
	if code != exitOK {
		t.Fatalf("rotate: %d %s", code, errs)
	}
	signer, own, _, err := reconcilerKeys(d.SigningKeyPath())
	if err != nil {
		t.Fatal(err)
	}
	if signer.PublicKey() == old || !strings.Contains(out, signer.PublicKey()) {
		t.Fatalf("rotate printed %q; the seed's key is %s, the old one %s", out, signer.PublicKey(), old)
	}
	overlap, _ := store.ReadTrustFile(d.TrustPath())
	if got := overlap.Keys(); len(got) != 2 || !slices.Contains(got, old) || !slices.Contains(got, signer.PublicKey()) {
		t.Errorf("trust during the overlap: %v, want the old and the new key", got)
	}
	if got := own.Keys(); len(got) != 2 || !slices.Contains(got, old) {
		t.Errorf("the reconciler's own keys: %v, want the new one and the retired %s", got, old)
	}
	if code, _, errs := runCLI(ctx, "auth", "rotate-reconciler", "--dir", dir, "--finish"); code != exitOK {
		t.Fatalf("rotate --finish: %d %s", code, errs)
	}
	after, _ := store.ReadTrustFile(d.TrustPath())
	if got := after.Keys(); len(got) != 1 || got[0] != signer.PublicKey() {
		t.Errorf("trust after --finish: %v, want only %s", got, signer.PublicKey())
	}
}

// role is a meshfold command running in this process, for tests.
type role struct {
	out    *lines
	errb   *storetest.SyncBuffer
	cancel context.CancelFunc
	done   chan int
}

// startRole runs meshfold args in the background until stop.
func startRole(ctx context.Context, args ...string) *role {
	cctx, cancel := context.WithCancel(ctx)
	r := &role{out: &lines{ch: make(chan string, 8)}, errb: &storetest.SyncBuffer{}, cancel: cancel, done: make(chan int, 1)}
	go func() { r.done <- run(cctx, append(args, "--log-level", "warn"), nil, r.out, r.errb) }()
	return r
}

// line returns the role's next line of stdout.
func (r *role) line(t *testing.T, ctx context.Context) string {
	t.Helper()
	select {
	case l := <-r.out.ch:
		return l
	case code := <-r.done:
		t.Fatalf("exited %d: %s", code, r.errb.String())
	case <-ctx.Done():
		t.Fatalf("printed nothing: %s", r.errb.String())
	}
	return ""
}

// stop ends the role and checks it exited cleanly.
func (r *role) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	if code := <-r.done; code != exitOK {
		t.Errorf("exit %d: %s", code, r.errb.String())
	}
}

// startServe runs serve on data and returns it with its NATS URL and the
// public key it signs with, once it has written the trust file.
func startServe(t *testing.T, ctx context.Context, data string) (srv *role, url, key string) {
	t.Helper()
	srv = startRole(ctx, "serve", "--data", data, "--listen", "127.0.0.1:0")
	t.Cleanup(srv.cancel)
	m := regexp.MustCompile(`serving NATS at (\S+);`).FindStringSubmatch(srv.line(t, ctx))
	k := regexp.MustCompile(`plans and knocks signed with (?:a new key, )?(N[A-Z0-9]+)`).FindStringSubmatch(srv.line(t, ctx))
	if m == nil || k == nil {
		t.Fatal("serve's first lines name no URL or key")
	}
	if trust, _ := defaultTrustFile(); !strings.Contains(srv.line(t, ctx), trust) {
		t.Fatalf("serve's trust line does not name %s", trust)
	}
	return srv, m[1], k[1]
}

// Two meshes on one machine (the README's demo serve, then the
// walkthrough's): each serve adds its key to the default trust file
// instead of replacing it, so that the node agents of either, started or
// restarted after the other serve, apply their own reconciler's plans,
// and restarts add no key twice.
func TestTwoServesShareTheDefaultTrustFile(t *testing.T) {
	state := t.TempDir()
	t.Setenv("XDG_STATE_HOME", state)
	ctx := testCtx(t)
	base := t.TempDir()
	trustPath, _ := defaultTrustFile()
	if !strings.HasPrefix(trustPath, state) {
		t.Fatalf("default trust file %s outside the test's state %s", trustPath, state)
	}
	data := map[string]string{"ace": filepath.Join(base, "a"), "bob": filepath.Join(base, "b")}
	type served struct {
		srv      *role
		url, key string
	}
	// Both start together: the lock keeps either add from losing the other.
	started := map[string]chan served{"ace": make(chan served, 1), "bob": make(chan served, 1)}
	for node, d := range data {
		go func() {
			srv := startRole(ctx, "serve", "--data", d, "--listen", "127.0.0.1:0")
			t.Cleanup(srv.cancel)
			var s served
			s.srv = srv
			for range 3 { // URL, key, trust file
				select {
				case l := <-srv.out.ch:
					if m := regexp.MustCompile(`serving NATS at (\S+);`).FindStringSubmatch(l); m != nil {
						s.url = m[1]
					}
					if m := regexp.MustCompile(`signed with a new key, (N[A-Z0-9]+)`).FindStringSubmatch(l); m != nil {
						s.key = m[1]
					}
				case <-ctx.Done():
				}
			}
			started[node] <- s
		}()
	}
	meshes := map[string]served{}
	for node, ch := range started {
		s := <-ch
		if s.url == "" || s.key == "" {
			t.Fatalf("serve for %s did not start: %s", node, s.srv.errb.String())
		}
		meshes[node] = s
	}
	wantKeys := []string{meshes["ace"].key, meshes["bob"].key}
	slices.Sort(wantKeys)
	checkFile := func(when string) {
		t.Helper()
		raw, err := os.ReadFile(trustPath)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range wantKeys {
			if n := strings.Count(string(raw), k); n != 1 {
				t.Errorf("%s: the trust file lists %s %d times, want once:\n%s", when, k, n, raw)
			}
		}
		if trust, err := store.ReadTrustFile(trustPath); err != nil || !slices.Equal(trust.Keys(), wantKeys) {
			t.Fatalf("%s: trust file %v %v, want %v", when, trust.Keys(), err, wantKeys)
		}
	}
	checkFile("two serves started together")

	// apply runs node against url with the default trust until it applies
	// build, and checks it refused no plan.
	apply := func(node, url, build string) {
		t.Helper()
		root := filepath.Join(base, "root-"+node)
		agent := startRole(ctx, "node", node, "--root", root, "--state-dir", filepath.Join(base, "state-"+node), "-s", url, "--runtime", "record")
		defer agent.stop(t)
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		_, cfg, err := store.OpenStream(ctx, js, store.StreamConfig{})
		if err != nil {
			t.Fatal(err)
		}
		want := events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "app", Build: build}}}, time.Now())
		if _, err := store.NewPublisher(js, cfg.Subjects()).Append(ctx, node, want); err != nil {
			t.Fatal(err)
		}
		record := filepath.Join(root, ".meshfold", "modules", "app.json")
		pollUntil(t, node+" to apply "+build, func() bool {
			b, err := os.ReadFile(record)
			return err == nil && strings.Contains(string(b), build) || strings.Contains(agent.errb.String(), "plan refused")
		})
		if strings.Contains(agent.errb.String(), "plan refused") {
			t.Fatalf("%s refused its reconciler's plan:\n%s", node, agent.errb.String())
		}
	}
	apply("ace", meshes["ace"].url, "a:1")
	apply("bob", meshes["bob"].url, "b:1")

	// Restart both, bob's last (the one that used to win the file), then
	// restart ace's agent: it still trusts its own reconciler.
	for _, node := range []string{"ace", "bob"} {
		meshes[node].srv.stop(t)
	}
	var url string
	for _, node := range []string{"ace", "bob"} {
		srv, u, key := startServe(t, ctx, data[node])
		if key != meshes[node].key {
			t.Fatalf("%s's serve signs with %s after a restart, had %s", node, key, meshes[node].key)
		}
		defer srv.stop(t)
		if node == "ace" {
			url = u
		}
	}
	checkFile("both serves restarted")
	apply("ace", url, "a:2")
}
