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

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
	"github.com/meshfold/meshfold/store/storetest"
)

// Trust is per deployment and explicit (issue 24): serve writes its
// public key beside its data, and nothing in the machine's state
// directory; a node agent started without --trust or --trust-from is
// refused with how to give it, and one given the serve's data directory
// says at start which key it trusts and from where, and applies the
// reconciler's signed plans.
func TestServeThenNodeTrustsFromItsDataDir(t *testing.T) {
	// Not parallel: t.Setenv.
	state := t.TempDir()
	t.Setenv("XDG_STATE_HOME", state)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	base := t.TempDir()
	data := filepath.Join(base, "data")
	srv, url, key := startServe(t, ctx, data)
	defer srv.stop(t)
	if trust, err := store.ReadTrustFile(filepath.Join(data, trustFileName)); err != nil || !slices.Equal(trust.Keys(), []string{key}) {
		t.Fatalf("trust file beside the data: %v %v, want the key %s", trust.Keys(), err, key)
	}
	if entries, _ := os.ReadDir(state); len(entries) != 0 {
		t.Errorf("serve wrote into the machine's state directory: %v", entries)
	}

	root := filepath.Join(base, "root")
	args := []string{"node", "ace", "--root", root, "--state-dir", filepath.Join(base, "state"), "-s", url, "--runtime", "record"}
	if code, _, errs := runCLI(ctx, args...); code != exitUsage || !strings.Contains(errs, "--trust-from DIR") {
		t.Fatalf("node without trust: exit %d %q, want %d naming --trust-from", code, errs, exitUsage)
	}
	agent := startRole(ctx, append(args, "--trust-from", data)...)
	defer agent.stop(t)
	if l := agent.line(t, ctx); !strings.Contains(l, "node agent ace trusts plans and knocks signed by "+key+" (from "+filepath.Join(data, trustFileName)+")") {
		t.Errorf("the agent's first line %q does not say which key it trusts and from where", l)
	}
	js, _ := jetstream.New(dial(t, url))
	_, cfg, err := store.OpenStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	want := events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "app", Build: "a:1"}}}, time.Now())
	if _, err := store.NewPublisher(js, cfg.Subjects()).Append(ctx, "ace", want); err != nil {
		t.Fatal(err)
	}
	record := filepath.Join(root, ".meshfold", "modules", "app.json")
	pollUntil(t, "the node to apply the signed plan", func() bool { _, err := os.Stat(record); return err == nil })
	if strings.Contains(agent.errb.String(), "plan refused") {
		t.Errorf("the node refused a plan:\n%s", agent.errb.String())
	}
}

// auth rotate-reconciler: a new key, the old one retired, and an overlap
// where the trust file names both; --finish ends it.
func TestAuthRotateReconciler(t *testing.T) {
	t.Parallel()
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
	if !overlap.Retired(old) || overlap.Retired(signer.PublicKey()) || !strings.Contains(out, "until ") {
		t.Errorf("trust during the overlap: %s, want the old key retired until a time the command printed (%q)", overlap, out)
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

// A serve without --auth rotates its key with rotate-reconciler on its
// data directory (a fresh user's finding U12: it was refused as "not a
// meshfold auth directory"): the old key retired and still its own, the
// trust file naming both until --finish, kept as it is when serve starts
// again with the new key. A directory that is neither is refused, naming
// both kinds.
func TestRotateServeDataDir(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	data := filepath.Join(t.TempDir(), "data")
	srv, _, old := startServe(t, ctx, data)
	srv.stop(t)
	code, out, errs := runCLI(ctx, "auth", "rotate-reconciler", "--dir", data)
	if code != exitOK {
		t.Fatalf("rotate of a serve data directory: exit %d %s", code, errs)
	}
	signer, own, _, err := reconcilerKeys(filepath.Join(data, signingKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	key := signer.PublicKey()
	if key == old || !strings.Contains(out, key) || !strings.Contains(out, "--trust-from "+data) {
		t.Fatalf("rotate printed %q; the seed's key is %s, the old one %s; want the new key and --trust-from named", out, key, old)
	}
	if !own.Trusts(old) || !own.Trusts(key) {
		t.Errorf("serve's own keys after the rotation: %s, want %s and the retired %s", own, key, old)
	}
	overlap := func(when string) {
		t.Helper()
		tr, err := store.ReadTrustFile(filepath.Join(data, trustFileName))
		if err != nil || !slices.Equal(tr.Current(), []string{key}) || !tr.Retired(old) {
			t.Errorf("%s: the trust file names %s (%v), want %s and %s retired", when, tr, err, key, old)
		}
	}
	overlap("after the rotation")
	srv, _, started := startServe(t, ctx, data)
	if started != key {
		t.Errorf("serve after the rotation signs with %s, want %s", started, key)
	}
	overlap("after serve started again")
	srv.stop(t)
	if code, out, errs := runCLI(ctx, "auth", "rotate-reconciler", "--dir", data, "--finish"); code != exitOK || !strings.Contains(out, "trusts only "+key) {
		t.Fatalf("rotate --finish: exit %d %q %s", code, out, errs)
	}
	if tr, err := store.ReadTrustFile(filepath.Join(data, trustFileName)); err != nil || !slices.Equal(tr.Keys(), []string{key}) {
		t.Errorf("trust after --finish: %v %v, want only %s", tr.Keys(), err, key)
	}
	code, _, errs = runCLI(ctx, "auth", "rotate-reconciler", "--dir", t.TempDir())
	if code != exitUsage || !strings.Contains(errs, "neither an auth directory") || !strings.Contains(errs, "--data directory of a meshfold serve") {
		t.Errorf("rotate of an empty directory: exit %d %q, want %d naming both kinds of directory", code, errs, exitUsage)
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
// public key it signs with, once it has written the trust file beside
// its data.
func startServe(t *testing.T, ctx context.Context, data string) (srv *role, url, key string) {
	t.Helper()
	srv = startRole(ctx, "serve", "--data", data, "--listen", "127.0.0.1:0")
	t.Cleanup(srv.cancel)
	m := regexp.MustCompile(`serving NATS at (\S+);`).FindStringSubmatch(srv.line(t, ctx))
	k := regexp.MustCompile(`plans and knocks signed with (?:a new key, )?(N[A-Z0-9]+)`).FindStringSubmatch(srv.line(t, ctx))
	if m == nil || k == nil {
		t.Fatal("serve's first lines name no URL or key")
	}
	if l := srv.line(t, ctx); !strings.Contains(l, "--trust-from "+data+" ("+filepath.Join(data, trustFileName)+")") {
		t.Fatalf("serve's trust line %q does not name its data directory", l)
	}
	return srv, m[1], k[1]
}

// Two meshes on one machine (the README's demo serve, then the
// walkthrough's): each serve's key stays beside its own data, so each
// one's agents apply their own reconciler's plans, also after both serves
// restarted, and an agent given the other deployment's keys refuses them:
// no deployment trusts another's reconciler.
func TestTwoServesTrustOnlyTheirOwn(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	base := t.TempDir()
	data := map[string]string{"ace": filepath.Join(base, "a"), "bob": filepath.Join(base, "b")}
	type served struct {
		srv      *role
		url, key string
	}
	meshes := map[string]served{}
	for _, node := range []string{"ace", "bob"} {
		srv, url, key := startServe(t, ctx, data[node])
		meshes[node] = served{srv, url, key}
	}
	if meshes["ace"].key == meshes["bob"].key {
		t.Fatal("two deployments sign with one key")
	}

	// apply runs node against url trusting the keys of trustFrom until it
	// applies build, or refuses the plan when refused.
	apply := func(node, url, trustFrom, build string, refused bool) {
		t.Helper()
		root := filepath.Join(base, "root-"+node)
		agent := startRole(ctx, "node", node, "--root", root, "--state-dir", filepath.Join(base, "state-"+node), "-s", url,
			"--runtime", "record", "--trust-from", trustFrom)
		defer agent.stop(t)
		defer func() {
			if t.Failed() {
				t.Logf("%s's agent said:\n%s", node, agent.errb.String())
			}
		}()
		nc := dial(t, url)
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
		pollUntil(t, node+" to apply or refuse "+build, func() bool {
			b, err := os.ReadFile(record)
			return err == nil && strings.Contains(string(b), build) || strings.Contains(agent.errb.String(), "plan refused")
		})
		if got := strings.Contains(agent.errb.String(), "plan refused"); got != refused {
			t.Fatalf("%s trusting %s: refused %v, want %v:\n%s", node, trustFrom, got, refused, agent.errb.String())
		}
	}
	apply("ace", meshes["ace"].url, data["ace"], "a:1", false)
	apply("bob", meshes["bob"].url, data["bob"], "b:1", false)
	apply("cid", meshes["bob"].url, data["ace"], "c:1", true)

	// Restart both, then ace's agent: it still trusts its own reconciler.
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
	apply("ace", url, data["ace"], "a:2", false)
}
