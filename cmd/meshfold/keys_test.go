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
