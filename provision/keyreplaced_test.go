package provision_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/provision"
	"github.com/meshfold/meshfold/store"
)

// A running provisioner warns, once per change, when the node's
// registered curve key is replaced by another (a stolen provisioner
// credential registers the thief's), and, restarted, warns when it
// registers its own key over another, naming that key and when it was
// registered (a tester's finding G3: both were silent, or at info).
func TestRegisteredKeyReplacedWarns(t *testing.T) {
	e := newSealedEnv(t)
	p := e.plan(t, "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.settled(t, p)
	start := func() (stop func()) {
		rep := newReports()
		c := e.client(t, "", rep, func(cfg *provision.Config) {
			cfg.Sources = []provision.Source{e.sealed(t)}
			cfg.Resync = -1
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		rep.next(t) // the fill on start: the watch runs
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
		}
	}
	const watchWarn = "the node's registered curve key is no longer this provisioner's"
	const startWarn = "registered this provisioner's curve key over another one"
	waitLog := func(what string, n int) {
		t.Helper()
		for deadline := time.Now().Add(wait); strings.Count(e.logs.String(), what) < n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %d× %q in the log:\n%s", n, what, e.logs.String())
			}
		}
	}
	thief := func() string {
		kp, err := nkeys.CreateCurveKeys()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		if _, err := e.kv.Put(ctxT(t), store.CurveKeyName("ace"), []byte(pub)); err != nil {
			t.Fatal(err)
		}
		return pub
	}
	stop := start()
	if strings.Contains(e.logs.String(), startWarn) {
		t.Fatalf("a first registration warned:\n%s", e.logs.String())
	}
	k1 := thief()
	waitLog(watchWarn, 1)
	if !strings.Contains(e.logs.String(), provision.KeyFingerprint(k1)) {
		t.Errorf("the warning does not name the registered key %s:\n%s", provision.KeyFingerprint(k1), e.logs.String())
	}
	// The same key written again is no new change; a second thief's is.
	if _, err := e.kv.Put(ctxT(t), store.CurveKeyName("ace"), []byte(k1)); err != nil {
		t.Fatal(err)
	}
	k2 := thief()
	waitLog(provision.KeyFingerprint(k2), 1)
	if n := strings.Count(e.logs.String(), watchWarn); n != 2 {
		t.Errorf("%d warnings, want 2 (one per change):\n%s", n, e.logs.String())
	}
	stop()

	// Restarted with its own key file: it registers over k2, and says so.
	stop = start()
	defer stop()
	waitLog(startWarn, 1)
	for _, l := range strings.Split(e.logs.String(), "\n") {
		if strings.Contains(l, startWarn) && (!strings.Contains(l, "level=WARN") || !strings.Contains(l, "replaced_key="+provision.KeyFingerprint(k2)) ||
			!strings.Contains(l, "replaced_key_registered_at=")) {
			t.Errorf("the restart's line is not a warning naming the replaced key and its time: %s", l)
		}
	}
	if pub, _, err := provision.RegisteredKey(ctxT(t), e.kv, "ace"); err != nil || pub != e.sealed(t).PublicKey() {
		t.Errorf("registered %s, %v; want this provisioner's key again", pub, err)
	}
	noLeak(t, e.logs.String())
}
