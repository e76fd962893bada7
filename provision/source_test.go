package provision_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/provision"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// helper writes an exec helper script and returns its path.
func helper(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "helper")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// An exec helper gets node, module and path as arguments and in its
// environment; exit 0 with output is the content, exit ExitNothing is no
// source, any other non-zero exit, exit 0 with no output and a timeout are
// failures; its stdout is never logged and its stderr at most as one line.
func TestExecSource(t *testing.T) {
	logs := &storetest.SyncBuffer{}
	log := slogTo(logs)
	ctx := ctxT(t)
	args := &provision.Exec{Command: helper(t, `[ "$1 $2 $3" = "$MESHFOLD_NODE $MESHFOLD_MODULE $MESHFOLD_PATH" ] || exit 9
printf '%s' "`+secret+`-$1-$2-$3"`), Log: log}
	got, err := args.Content(ctx, "ace", mbg, creds)
	if err != nil || string(got) != secret+"-ace-"+mbg+"-"+creds {
		t.Fatalf("content %q, %v", got, err)
	}
	_, err = (&provision.Exec{Command: helper(t, fmt.Sprintf("echo 'No value found' >&2; exit %d", provision.ExitNothing)), Log: log}).Content(ctx, "ace", mbg, creds)
	if !errors.Is(err, provision.ErrNoSource) {
		t.Errorf("exit %d: %v, want no source", provision.ExitNothing, err)
	}
	// A backend that is down (vault and sops exit non-zero for it as for
	// a missing key) or a pipeline whose first command failed (it ends 0
	// with nothing printed) is a failure, never "nothing": the sources
	// after it could hold an older content (a tester's finding G2).
	for name, body := range map[string]string{
		"empty":    "exit 0",
		"pipeline": "false | cat",
		"non-zero": "echo " + secret + "; echo 'vault: permission denied' >&2; echo second line >&2; exit 2",
	} {
		_, err := (&provision.Exec{Command: helper(t, body), Log: log}).Content(ctx, "ace", mbg, creds)
		if err == nil || errors.Is(err, provision.ErrNoSource) || !strings.Contains(err.Error(), fmt.Sprintf("exit %d", provision.ExitNothing)) {
			t.Errorf("%s: %v, want a failure that names exit %d", name, err, provision.ExitNothing)
		}
	}
	// A mistyped or non-executable helper cannot start: a failed source
	// (source-failed), not a secret it lacks (missing).
	notExec := filepath.Join(t.TempDir(), "helper")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\necho x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, cmd := range map[string]string{"not found": "/nonexistent/helper", "not executable": notExec} {
		_, err := (&provision.Exec{Command: cmd, Log: log}).Content(ctx, "ace", mbg, creds)
		if err == nil || errors.Is(err, provision.ErrNoSource) || !strings.Contains(err.Error(), "could not start") || !strings.Contains(err.Error(), name) {
			t.Errorf("a helper that is %s: %v, want a failure that says it could not start", name, err)
		}
	}
	start := time.Now()
	_, err = (&provision.Exec{Command: helper(t, "sleep 30"), Timeout: 200 * time.Millisecond, Log: log}).Content(ctx, "ace", mbg, creds)
	if err == nil || errors.Is(err, provision.ErrNoSource) || !strings.Contains(err.Error(), "timed out") {
		t.Errorf("a helper past its timeout: %v, want a failure", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the timed-out helper took %s to end", d)
	}
	if !strings.Contains(logs.String(), "vault: permission denied") {
		t.Errorf("the helper's stderr line is not logged:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "second line") {
		t.Errorf("more than one stderr line logged:\n%s", logs.String())
	}
	noLeak(t, logs.String())
}

// A helper that fails the same way on every retry (every
// --retry-unfilled) has its stderr line logged at warn once, then at
// debug; a new line, or the same after a run without stderr, is warned
// again. Each file has its own last line.
func TestExecStderrWarnedOncePerChange(t *testing.T) {
	logs := &storetest.SyncBuffer{}
	ctx := ctxT(t)
	dir := t.TempDir()
	ctl := filepath.Join(dir, "say")
	say := func(s string) {
		if err := os.WriteFile(ctl, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	x := &provision.Exec{Command: helper(t, `s=$(cat `+ctl+`); [ -n "$s" ] && echo "$s" >&2; exit 2`), Log: slogTo(logs)}
	run := func(path string) {
		if _, err := x.Content(ctx, "ace", mbg, path); err == nil || errors.Is(err, provision.ErrNoSource) {
			t.Fatalf("%v, want a failure", err)
		}
	}
	say("vault: permission denied")
	for range 3 {
		run(creds)
	}
	run("/run/other")
	say("vault: sealed")
	run(creds)
	say("")
	run(creds)
	say("vault: sealed")
	run(creds)
	w := strings.Count(logs.String(), `level=WARN msg="exec source said"`)
	d := strings.Count(logs.String(), `level=DEBUG msg="exec source said"`)
	if w != 4 || d != 2 {
		t.Errorf("%d warn and %d debug lines, want 4 (the first line, the other file's, a new line, the line after a quiet run) and 2 (the repeats):\n%s", w, d, logs.String())
	}
}

// Sources are tried in order: the first with content wins; when none has
// content, the report says why, source by source, and the status bucket
// keeps it until the file is filled.
func TestSourcesInOrderAndStatus(t *testing.T) {
	e := newEnv(t)
	e.startNode(t)
	status, err := store.OpenFillStatus(ctxT(t), e.js, e.cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	p := e.plan(t, "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.settled(t, p)
	dir := t.TempDir()
	nothing := &provision.Exec{Command: helper(t, fmt.Sprintf("echo 'No value found' >&2; exit %d", provision.ExitNothing)), Log: e.logger()}
	c := e.client(t, "", nil, func(cfg *provision.Config) {
		cfg.Sources = []provision.Source{nothing, provision.Dir(dir)}
		cfg.Status = status
	})
	r, err := c.FillOnce(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Unfilled) != 1 || r.Unfilled[0].State != store.FillMissing || !strings.Contains(r.Unfilled[0].Why, "has nothing") ||
		!strings.Contains(r.Unfilled[0].Why, "no file") {
		t.Fatalf("unfilled = %+v, want missing from both sources", r.Unfilled)
	}
	sts, err := store.ReadFillStatus(ctxT(t), status, "ace")
	if err != nil || len(sts) != 1 || sts[0].State != store.FillMissing || sts[0].Path != creds {
		t.Fatalf("status = %+v, %v", sts, err)
	}
	// The directory gets the file: the helper before it, which has
	// nothing for it, is passed over.
	source(t, dir, mbg, creds, secret)
	r, err = c.FillOnce(ctxT(t))
	if err != nil || len(r.Filled) != 1 {
		t.Fatalf("report %+v, %v; want filled", r, err)
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)
	if sts, err := store.ReadFillStatus(ctxT(t), status, "ace"); err != nil || len(sts) != 0 {
		t.Fatalf("status after the fill = %+v, %v; want cleared", sts, err)
	}
	noLeak(t, e.logs.String())
}

// sealedEnv is a node agent, the secrets bucket and a provisioner with
// the sealed source (and its status) for ace.
type sealedEnv struct {
	*env
	kv      jetstream.KeyValue
	status  jetstream.KeyValue
	keyFile string
}

func newSealedEnv(t *testing.T) *sealedEnv {
	e := newEnv(t)
	e.startNode(t)
	kv, err := store.OpenSecrets(ctxT(t), e.js, e.cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	status, err := store.OpenFillStatus(ctxT(t), e.js, e.cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	return &sealedEnv{env: e, kv: kv, status: status, keyFile: filepath.Join(t.TempDir(), "prov", "curve.key")}
}

func (e *sealedEnv) sealed(t *testing.T) *provision.Sealed {
	key, err := provision.LoadCurveKey(e.keyFile)
	if err != nil {
		t.Fatal(err)
	}
	s, err := provision.NewSealed(e.kv, key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// put seals content to ace's registered key, as `secret put` does.
func (e *sealedEnv) put(t *testing.T, path, content string) uint64 {
	t.Helper()
	ctx := ctxT(t)
	k, err := e.kv.Get(ctx, store.CurveKeyName("ace"))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := store.SealSecret("ace", mbg, path, []byte(content), string(k.Value()), []byte("0123456789abcdef0123456789abcdef"), "alice", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(rec)
	rev, err := e.kv.Put(ctx, store.SecretKey("ace", mbg, path), data)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// waitStatus waits until pred holds for ace's statuses.
func (e *sealedEnv) waitStatus(t *testing.T, what string, pred func([]store.FillStatus) bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	w, err := e.status.Watch(ctxT(t), "ace.>")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for {
		sts, err := store.ReadFillStatus(ctxT(t), e.status, "ace")
		if err == nil && pred(sts) {
			return
		}
		select {
		case <-w.Updates():
		case <-time.After(time.Until(deadline)):
			t.Fatalf("%s: status %+v, %v", what, sts, err)
		}
	}
}

// A put reaches the node without a knock: the client watches its keys.
// The key file is created 0600 and registered; a tampered ciphertext and
// one sealed to another key are refused, reported in the status bucket,
// and never written; a good put clears the status.
func TestSealedPutFillsAtOnce(t *testing.T) {
	e := newSealedEnv(t)
	p := e.plan(t, "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0640"}}})
	e.settled(t, p)
	rep := newReports()
	c := e.client(t, "", rep, func(cfg *provision.Config) {
		cfg.Sources = []provision.Source{e.sealed(t)}
		cfg.Status = e.status
		cfg.Resync = -1
	})
	run(t, c.Run)
	if got := rep.next(t); len(got.r.Unfilled) != 1 || got.r.Unfilled[0].State != store.FillMissing {
		t.Fatalf("start: %+v, want the file unfilled (no secret yet)", got.r)
	}
	if fi, err := os.Stat(e.keyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v; want mode 0600", fi, err)
	}
	e.waitStatus(t, "missing", func(s []store.FillStatus) bool { return len(s) == 1 && s[0].State == store.FillMissing })

	e.put(t, creds, secret)
	if got := rep.next(t); len(got.r.Filled) != 1 {
		t.Fatalf("after a put: %+v, want filled", got.r)
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o640)
	e.waitStatus(t, "cleared", func(s []store.FillStatus) bool { return len(s) == 0 })

	// Tampered: one byte of the ciphertext flipped.
	ent, err := e.kv.Get(ctxT(t), store.SecretKey("ace", mbg, creds))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := store.DecodeSealedSecret(ent.Value())
	if err != nil {
		t.Fatal(err)
	}
	rec.Sealed[len(rec.Sealed)-1] ^= 1
	data, _ := json.Marshal(rec)
	if _, err := e.kv.Put(ctxT(t), store.SecretKey("ace", mbg, creds), data); err != nil {
		t.Fatal(err)
	}
	if got := rep.next(t); len(got.r.Filled) != 0 || len(got.r.Unfilled) != 1 || got.r.Unfilled[0].State != store.FillCannotOpen {
		t.Fatalf("tampered: %+v, want cannot-open, nothing written", got.r)
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o640)
	e.waitStatus(t, "cannot-open", func(s []store.FillStatus) bool { return len(s) == 1 && s[0].State == store.FillCannotOpen })

	// Sealed to another key (a rotated key, a put before registration).
	other := filepath.Join(t.TempDir(), "other.key")
	okp, err := provision.LoadCurveKey(other)
	if err != nil {
		t.Fatal(err)
	}
	opub, _ := okp.PublicKey()
	rec2, err := store.SealSecret("ace", mbg, creds, []byte("other-"+secret), opub, nil, "mallory", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	data, _ = json.Marshal(rec2)
	if _, err := e.kv.Put(ctxT(t), store.SecretKey("ace", mbg, creds), data); err != nil {
		t.Fatal(err)
	}
	if got := rep.next(t); len(got.r.Unfilled) != 1 || got.r.Unfilled[0].State != store.FillSealedToOther {
		t.Fatalf("other key: %+v, want sealed-to-other-key", got.r)
	}
	e.waitStatus(t, "sealed to another key", func(s []store.FillStatus) bool { return len(s) == 1 && s[0].State == store.FillSealedToOther })
	checkFile(t, filepath.Join(e.root, creds), secret, 0o640)

	// Re-sealed to the right key: filled again, status cleared.
	e.put(t, creds, "new-"+secret)
	if got := rep.next(t); len(got.r.Filled) != 1 {
		t.Fatalf("re-sealed: %+v, want filled", got.r)
	}
	checkFile(t, filepath.Join(e.root, creds), "new-"+secret, 0o640)
	e.waitStatus(t, "cleared again", func(s []store.FillStatus) bool { return len(s) == 0 })
	noLeak(t, e.logs.String())
}

// The reason that names a file's state leads its why, ahead of the
// sources before it that had nothing: fleet and state cut a long why in
// its middle, and "sealed to another key" must not be what is cut.
func TestStateReasonLeads(t *testing.T) {
	e := newSealedEnv(t)
	p := e.plan(t, "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0640"}}})
	e.settled(t, p)
	okp, err := provision.LoadCurveKey(filepath.Join(t.TempDir(), "other.key"))
	if err != nil {
		t.Fatal(err)
	}
	opub, _ := okp.PublicKey()
	rec, err := store.SealSecret("ace", mbg, creds, []byte(secret), opub, nil, "mallory", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(rec)
	if _, err := e.kv.Put(ctxT(t), store.SecretKey("ace", mbg, creds), data); err != nil {
		t.Fatal(err)
	}
	c := e.client(t, "", nil, func(cfg *provision.Config) {
		cfg.Sources = []provision.Source{provision.Dir(t.TempDir()), e.sealed(t)}
	})
	r, err := c.FillOnce(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Unfilled) != 1 || r.Unfilled[0].State != store.FillSealedToOther ||
		!strings.HasPrefix(r.Unfilled[0].Why, "sealed: ") || !strings.Contains(r.Unfilled[0].Why, "; dir ") {
		t.Fatalf("unfilled = %+v, want sealed-to-other-key, its reason first, then the directory's", r.Unfilled)
	}
}

// A ciphertext copied under another file's key does not open: the
// content is bound to its node, module and path.
func TestSealedBoundToItsFile(t *testing.T) {
	e := newSealedEnv(t)
	s := e.sealed(t)
	if _, err := s.Register(ctxT(t), "ace"); err != nil {
		t.Fatal(err)
	}
	e.put(t, creds, secret)
	ent, err := e.kv.Get(ctxT(t), store.SecretKey("ace", mbg, creds))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.kv.Put(ctxT(t), store.SecretKey("ace", mbg, "/etc/other"), ent.Value()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Content(ctxT(t), "ace", mbg, "/etc/other"); !errors.Is(err, store.ErrCannotOpen) {
		t.Fatalf("a copied ciphertext: %v, want %v", err, store.ErrCannotOpen)
	}
	if got, err := s.Content(ctxT(t), "ace", mbg, creds); err != nil || string(got) != secret {
		t.Fatalf("content %q, %v", got, err)
	}
}

// A put made while the provisioner is down is filled on its start.
func TestSealedPutWhileDown(t *testing.T) {
	e := newSealedEnv(t)
	p := e.plan(t, "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.settled(t, p)
	if _, err := e.sealed(t).Register(ctxT(t), "ace"); err != nil {
		t.Fatal(err) // its first start, long ago
	}
	e.put(t, creds, secret)
	rep := newReports()
	c := e.client(t, "", rep, func(cfg *provision.Config) {
		cfg.Sources = []provision.Source{e.sealed(t)}
		cfg.Resync = -1
	})
	run(t, c.Run)
	if got := rep.next(t); len(got.r.Filled) != 1 {
		t.Fatalf("start: %+v, want filled", got.r)
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)
}

func slogTo(w *storetest.SyncBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// A removal (`secret rm`) leaves the file as it is and keeps the sources
// after sealed from filling it with what they hold (a fresh user's
// finding 2: a directory's older content came back within a second and
// restarted the module); the status says who removed it. A new put fills
// again; a delete of the key (`rm --next-source`) hands the file to the
// next source.
func TestSealedRemovalKeepsLaterSourcesOut(t *testing.T) {
	e := newSealedEnv(t)
	p := e.plan(t, "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.settled(t, p)
	dir := t.TempDir()
	source(t, dir, mbg, creds, "old-"+secret)
	if _, err := e.sealed(t).Register(ctxT(t), "ace"); err != nil {
		t.Fatal(err)
	}
	e.put(t, creds, secret)
	rep := newReports()
	c := e.client(t, "", rep, func(cfg *provision.Config) {
		cfg.Sources = []provision.Source{e.sealed(t), provision.Dir(dir)}
		cfg.Status = e.status
		cfg.Resync = -1
	})
	run(t, c.Run)
	if got := rep.next(t); len(got.r.Filled) != 1 {
		t.Fatalf("start: %+v, want filled from sealed", got.r)
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)

	key := store.SecretKey("ace", mbg, creds)
	data, _ := json.Marshal(store.RemovedSecret("bob", time.Now()))
	if _, err := e.kv.Put(ctxT(t), key, data); err != nil {
		t.Fatal(err)
	}
	got := rep.next(t)
	if len(got.r.Filled) != 0 || len(got.r.Unfilled) != 1 || got.r.Unfilled[0].State != store.FillMissing ||
		!strings.Contains(got.r.Unfilled[0].Why, "removed by bob") || strings.Contains(got.r.Unfilled[0].Why, "dir ") {
		t.Fatalf("after the removal: %+v, want unfilled, removed by bob, the directory not consulted", got.r)
	}
	e.waitStatus(t, "removed", func(s []store.FillStatus) bool {
		return len(s) == 1 && strings.Contains(s[0].Why, "removed by bob")
	})
	// A full pass (a resync, a restart) does not consult the directory either.
	r, err := c.FillOnce(ctxT(t))
	if err != nil || len(r.Filled) != 0 {
		t.Fatalf("a pass after the removal: %+v, %v; want nothing filled", r, err)
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)

	e.put(t, creds, "new-"+secret)
	if got := rep.next(t); len(got.r.Filled) != 1 {
		t.Fatalf("a put after the removal: %+v, want filled", got.r)
	}
	checkFile(t, filepath.Join(e.root, creds), "new-"+secret, 0o600)

	if err := e.kv.Delete(ctxT(t), key); err != nil {
		t.Fatal(err)
	}
	if got := rep.next(t); len(got.r.Filled) != 1 {
		t.Fatalf("after a delete: %+v, want filled from the directory", got.r)
	}
	checkFile(t, filepath.Join(e.root, creds), "old-"+secret, 0o600)
	noLeak(t, e.logs.String())
}

// A sealed secret that exists but does not open (the provisioner's curve
// key changed: the node rebuilt, its key file lost; or a tampered
// ciphertext) keeps the sources after sealed out, as a removal does: the
// file keeps the content of the put, and the status says
// sealed-to-other-key (a fresh user's finding F6: a directory's older
// credential was filled over the rotated one and the module restarted
// onto it, with nothing flagged).
func TestUnopenableSealedKeepsLaterSourcesOut(t *testing.T) {
	e := newSealedEnv(t)
	p := e.plan(t, "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.settled(t, p)
	dir := t.TempDir()
	source(t, dir, mbg, creds, "old-"+secret)
	if _, err := e.sealed(t).Register(ctxT(t), "ace"); err != nil {
		t.Fatal(err)
	}
	e.put(t, creds, secret)
	first := e.client(t, "", nil, func(cfg *provision.Config) {
		cfg.Sources = []provision.Source{e.sealed(t), provision.Dir(dir)}
		cfg.Status = e.status
	})
	if r, err := first.FillOnce(ctxT(t)); err != nil || len(r.Filled) != 1 {
		t.Fatalf("first key: %+v, %v; want filled from sealed", r, err)
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)

	// A new key: the provisioner restarted with another --key.
	e.keyFile = filepath.Join(t.TempDir(), "new", "curve.key")
	rep := newReports()
	c := e.client(t, "", rep, func(cfg *provision.Config) {
		cfg.Sources = []provision.Source{e.sealed(t), provision.Dir(dir)}
		cfg.Status = e.status
		cfg.Resync = -1
	})
	run(t, c.Run)
	got := rep.next(t)
	if len(got.r.Filled)+len(got.r.Unchanged) != 0 || len(got.r.Unfilled) != 1 || got.r.Unfilled[0].State != store.FillSealedToOther ||
		strings.Contains(got.r.Unfilled[0].Why, "dir ") || !strings.Contains(got.r.Unfilled[0].Why, "not consulted") {
		t.Fatalf("new key: %+v, want sealed-to-other-key, the directory not consulted", got.r)
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)
	e.waitStatus(t, "sealed to another key", func(s []store.FillStatus) bool {
		return len(s) == 1 && s[0].State == store.FillSealedToOther
	})

	// Tampered: cannot-open, the directory not consulted either.
	ent, err := e.kv.Get(ctxT(t), store.SecretKey("ace", mbg, creds))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := store.DecodeSealedSecret(ent.Value())
	if err != nil {
		t.Fatal(err)
	}
	k, err := e.kv.Get(ctxT(t), store.CurveKeyName("ace"))
	if err != nil {
		t.Fatal(err)
	}
	rec.To = string(k.Value()) // as if sealed to the new key, but the ciphertext is not
	data, _ := json.Marshal(rec)
	if _, err := e.kv.Put(ctxT(t), store.SecretKey("ace", mbg, creds), data); err != nil {
		t.Fatal(err)
	}
	if got := rep.next(t); len(got.r.Filled) != 0 || len(got.r.Unfilled) != 1 || got.r.Unfilled[0].State != store.FillCannotOpen ||
		strings.Contains(got.r.Unfilled[0].Why, "dir ") {
		t.Fatalf("cannot open: %+v, want cannot-open, the directory not consulted", got.r)
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)

	// Put again to the new key: filled, the status cleared.
	e.put(t, creds, "new-"+secret)
	if got := rep.next(t); len(got.r.Filled) != 1 {
		t.Fatalf("put again: %+v, want filled", got.r)
	}
	checkFile(t, filepath.Join(e.root, creds), "new-"+secret, 0o600)
	e.waitStatus(t, "cleared", func(s []store.FillStatus) bool { return len(s) == 0 })
	noLeak(t, e.logs.String())
}

// A sealed secret put behind an earlier source that holds the file
// (--from DIR before --from sealed) is shadowed: the node keeps the
// directory's content, as the documented order says, and the status says
// the put is shadowed and by which source, named apart in its Source for
// 'secret put' and 'secret ls' to show (a fresh user's finding F7: the
// put exited 0, the log said "filled", nothing said otherwise). The same
// content in both is not shadowed; a removal of the file from the
// directory lets the put through and clears the status.
func TestSealedShadowedByEarlierSource(t *testing.T) {
	e := newSealedEnv(t)
	p := e.plan(t, "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.settled(t, p)
	dir := t.TempDir()
	source(t, dir, mbg, creds, "old-"+secret)
	rep := newReports()
	c := e.client(t, "", rep, func(cfg *provision.Config) {
		cfg.Sources = []provision.Source{provision.Dir(dir), e.sealed(t)}
		cfg.Status = e.status
		cfg.Resync = -1
	})
	run(t, c.Run)
	if got := rep.next(t); len(got.r.Filled) != 1 || len(got.r.Shadowed) != 0 {
		t.Fatalf("start: %+v, want filled from the directory, nothing shadowed (no secret yet)", got.r)
	}
	e.put(t, creds, "new-"+secret)
	got := rep.next(t)
	if len(got.r.Unchanged) != 1 || len(got.r.Shadowed) != 1 {
		t.Fatalf("put: %+v, want unchanged (the directory's) and shadowed", got.r)
	}
	checkFile(t, filepath.Join(e.root, creds), "old-"+secret, 0o600)
	e.waitStatus(t, "shadowed", func(s []store.FillStatus) bool {
		return len(s) == 1 && s[0].State == store.FillShadowed && strings.Contains(s[0].Why, "filled from dir "+dir+", tried before sealed") &&
			strings.Contains(s[0].Why, "put by alice") && s[0].Source == "dir "+dir
	})
	if !strings.Contains(e.logs.String(), "sealed secret changed: shadowed") {
		t.Fatalf("log does not say the put is shadowed:\n%s", e.logs.String())
	}
	// The same content in both: nothing is shadowed.
	e.put(t, creds, "old-"+secret)
	if got := rep.next(t); len(got.r.Shadowed) != 0 {
		t.Fatalf("same content: %+v, want nothing shadowed", got.r)
	}
	e.waitStatus(t, "cleared", func(s []store.FillStatus) bool { return len(s) == 0 })
	// Shadowed again, then the directory's file removed: the put fills.
	e.put(t, creds, "new-"+secret)
	if got := rep.next(t); len(got.r.Shadowed) != 1 {
		t.Fatalf("put again: %+v, want shadowed", got.r)
	}
	if err := os.Remove(filepath.Join(dir, mbg, creds)); err != nil {
		t.Fatal(err)
	}
	if r, err := c.FillOnce(ctxT(t)); err != nil || len(r.Filled) != 1 || len(r.Shadowed) != 0 {
		t.Fatalf("the directory's file removed: %+v, %v; want filled from sealed", r, err)
	}
	checkFile(t, filepath.Join(e.root, creds), "new-"+secret, 0o600)
	e.waitStatus(t, "cleared again", func(s []store.FillStatus) bool { return len(s) == 0 })
	noLeak(t, e.logs.String())
}

// A provisioner whose --account is not the plan's provisioner account
// (a typo after the first fill) warns once a plan, and each file the
// node refuses as wrong-account keeps a refused status naming both
// accounts until a write is accepted: the fold owes such a refusal only
// until a fill at its plan pays it, and the first fill had (a fresh
// user's finding F8: fleet said the node needed nothing while every
// rotation was refused).
func TestWrongAccountStatus(t *testing.T) {
	e := newEnv(t)
	e.startNode(t)
	status, err := store.OpenFillStatus(ctxT(t), e.js, e.cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	p := e.plan(t, "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.settled(t, p)
	from := t.TempDir()
	source(t, from, mbg, creds, secret)
	typo := e.client(t, from, nil, func(cfg *provision.Config) { cfg.Account = "prvo"; cfg.Status = status })
	for range 2 {
		r, err := typo.FillOnce(ctxT(t))
		if err != nil || len(r.Refused) != 1 || r.Refused[0].Reason != events.ReasonWrongAccount {
			t.Fatalf("typo'd account: %+v, %v; want one wrong-account refusal", r, err)
		}
	}
	sts, err := store.ReadFillStatus(ctxT(t), status, "ace")
	if err != nil || len(sts) != 1 || sts[0].State != store.FillRefused || !strings.Contains(sts[0].Why, "refuses writes from prvo") ||
		!strings.Contains(sts[0].Why, "--account prov") {
		t.Fatalf("status = %+v, %v; want refused, naming both accounts", sts, err)
	}
	if n := strings.Count(e.logs.String(), "is not the one the node's newest plan names"); n != 1 {
		t.Fatalf("%d account warnings, want 1 (once a plan):\n%s", n, e.logs.String())
	}
	// Restarted with the right account: the status it finds is cleared.
	rep := newReports()
	right := e.client(t, from, rep, func(cfg *provision.Config) { cfg.Status = status; cfg.Resync = -1 })
	run(t, right.Run)
	if got := rep.next(t); len(got.r.Filled) != 1 {
		t.Fatalf("right account: %+v; want filled", got.r)
	}
	if sts, err := store.ReadFillStatus(ctxT(t), status, "ace"); err != nil || len(sts) != 0 {
		t.Fatalf("status after an accepted write = %+v, %v; want cleared", sts, err)
	}
	noLeak(t, e.logs.String())
}

// flakyKV is a secrets bucket whose reads fail while fail is set, as a
// bucket without a leader (an election) or behind a loaded server's
// JetStream API queue answers.
type flakyKV struct {
	jetstream.KeyValue
	fail bool
}

func (k *flakyKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if k.fail {
		return nil, nats.ErrTimeout
	}
	return k.KeyValue.Get(ctx, key)
}

// A sealed source that cannot say what it holds (its bucket's read gets
// no answer, or the stored record does not decode) keeps the sources
// after it out, as a secret that does not open does: what a later source
// holds may be older than what an operator put, and filling it would
// roll the module back onto it until the next pass (the contract: content
// an operator put is never replaced, on its own, by what a later source
// holds). The file keeps the put's content and the status says why.
func TestUnreadableSealedKeepsLaterSourcesOut(t *testing.T) {
	e := newSealedEnv(t)
	p := e.plan(t, "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.settled(t, p)
	dir := t.TempDir()
	source(t, dir, mbg, creds, "old-"+secret)
	if _, err := e.sealed(t).Register(ctxT(t), "ace"); err != nil {
		t.Fatal(err)
	}
	e.put(t, creds, secret)
	key, err := provision.LoadCurveKey(e.keyFile)
	if err != nil {
		t.Fatal(err)
	}
	flaky := &flakyKV{KeyValue: e.kv}
	sealed, err := provision.NewSealed(flaky, key)
	if err != nil {
		t.Fatal(err)
	}
	c := e.client(t, "", nil, func(cfg *provision.Config) {
		cfg.Sources = []provision.Source{sealed, provision.Dir(dir)}
		cfg.Status = e.status
	})
	if r, err := c.FillOnce(ctxT(t)); err != nil || len(r.Filled) != 1 {
		t.Fatalf("first pass: %+v, %v; want filled from sealed", r, err)
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)

	// The bucket's read gets no answer: the directory is not consulted.
	flaky.fail = true
	r, err := c.FillOnce(ctxT(t))
	if err != nil || len(r.Filled)+len(r.Unchanged) != 0 || len(r.Unfilled) != 1 || strings.Contains(r.Unfilled[0].Why, "dir ") {
		t.Fatalf("sealed unread: %+v, %v; want unfilled, the directory not consulted", r, err)
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)
	flaky.fail = false

	// A stored record that does not decode: cannot-open, the directory
	// not consulted either.
	if _, err := e.kv.Put(ctxT(t), store.SecretKey("ace", mbg, creds), []byte("{not a sealed secret")); err != nil {
		t.Fatal(err)
	}
	r, err = c.FillOnce(ctxT(t))
	if err != nil || len(r.Filled)+len(r.Unchanged) != 0 || len(r.Unfilled) != 1 || r.Unfilled[0].State != store.FillCannotOpen ||
		strings.Contains(r.Unfilled[0].Why, "dir ") {
		t.Fatalf("undecodable record: %+v, %v; want cannot-open, the directory not consulted", r, err)
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)
	noLeak(t, e.logs.String())
}

// A source that fails, but does not say it has nothing, keeps the later
// sources out as a sealed secret that does not open does (a fresh user's
// finding U29): a helper that printed more than MaxContent, timed out,
// could not start or exited non-zero but not ExitNothing (its backend
// down: a tester's finding G2) may hold a newer credential than a
// directory after it. The file keeps its content; the status says
// source-failed. Exit ExitNothing hands the file to the directory.
func TestFailedExecKeepsLaterSourcesOut(t *testing.T) {
	e := newEnv(t)
	e.startNode(t)
	status, err := store.OpenFillStatus(ctxT(t), e.js, e.cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	p := e.plan(t, "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.settled(t, p)
	dir := t.TempDir()
	source(t, dir, mbg, creds, "older-from-the-directory")
	mode := filepath.Join(t.TempDir(), "mode")
	write := func(m string) {
		if err := os.WriteFile(mode, []byte(m), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("good")
	x := &provision.Exec{Command: helper(t, `case $(cat `+mode+`) in
good) printf '%s' "`+secret+`";;
big) head -c 1100000 /dev/zero | tr '\0' x;;
hang) sleep 30;;
down) echo 'Error making API request: dial tcp 127.0.0.1:8200: connect: connection refused' >&2; exit 2;;
nothing) exit `+fmt.Sprint(provision.ExitNothing)+`;;
esac`), Timeout: 3 * time.Second, Log: e.logger()} // 1 s timed "big" out under -race on a loaded machine
	c := e.client(t, "", nil, func(cfg *provision.Config) {
		cfg.Sources = []provision.Source{x, provision.Dir(dir)}
		cfg.Status = status
	})
	if r, err := c.FillOnce(ctxT(t)); err != nil || len(r.Filled) != 1 {
		t.Fatalf("report %+v, %v; want filled from the helper", r, err)
	}
	checkFile(t, filepath.Join(e.root, creds), secret, 0o600)
	for _, m := range []struct{ mode, why string }{
		{"big", "printed more than 1048576 bytes"},
		{"hang", "timed out"},
		// The backend down after the helper filled (vault exits 2 for
		// that as for a missing key): the directory's older content
		// must not replace the node's newer one (a tester's finding G2).
		{"down", "helper failed: exit status 2"},
	} {
		write(m.mode)
		r, err := c.FillOnce(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Filled)+len(r.Unchanged) != 0 || len(r.Unfilled) != 1 || r.Unfilled[0].State != store.FillSourceFailed ||
			!strings.Contains(r.Unfilled[0].Why, m.why) || !strings.Contains(r.Unfilled[0].Why, "not consulted") ||
			strings.Contains(r.Unfilled[0].Why, "dir ") || len(r.Failed) != 1 {
			t.Fatalf("helper %s: report %+v, want source-failed that keeps the directory out", m.mode, r)
		}
		checkFile(t, filepath.Join(e.root, creds), secret, 0o600)
		sts, err := store.ReadFillStatus(ctxT(t), status, "ace")
		if err != nil || len(sts) != 1 || sts[0].State != store.FillSourceFailed || !strings.Contains(sts[0].Why, m.why) {
			t.Fatalf("helper %s: status = %+v, %v; want source-failed", m.mode, sts, err)
		}
	}
	// A helper that says it has nothing (exit ExitNothing) hands the file
	// to the directory.
	write("nothing")
	if r, err := c.FillOnce(ctxT(t)); err != nil || len(r.Filled) != 1 {
		t.Fatalf("report %+v, %v; want filled from the directory", r, err)
	}
	checkFile(t, filepath.Join(e.root, creds), "older-from-the-directory", 0o600)
	noLeak(t, e.logs.String())
}

// waitFile waits until the node's file at path holds content and returns
// how long that took.
func waitFile(t *testing.T, path, content string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		if b, err := os.ReadFile(path); err == nil && string(b) == content {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("%s does not hold the content %s after it was sent", path, within)
		}
		time.Sleep(10 * time.Millisecond) // polling the file, bounded by within
	}
}

// A helper that hangs for one file (until its --exec-timeout) holds no
// other file: a sealed put, and a knock's fill of another file, reach
// the node at once while the hung file's retries run the helper (a fresh
// user's finding U16: 9.8 to 28 s behind a 10 s timeout).
func TestHungHelperHoldsNoOtherFile(t *testing.T) {
	e := newSealedEnv(t)
	const slow = "/run/mesh-build-go/slow.key"
	p := e.plan(t, "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: slow, Mode: "0600"}, {Path: creds, Mode: "0600"}}})
	e.settled(t, p)
	dir := t.TempDir()
	hang, hung := filepath.Join(dir, "hang"), filepath.Join(dir, "hung")
	x := &provision.Exec{Command: helper(t, `[ "$3" = `+slow+` ] && [ -e `+hang+` ] && { touch `+hung+`; sleep 60; }
exit `+fmt.Sprint(provision.ExitNothing)), Timeout: 30 * time.Second, Log: e.logger()}
	rep := newReports()
	c := e.client(t, "", rep, func(cfg *provision.Config) {
		cfg.Sources = []provision.Source{x, e.sealed(t)}
		cfg.Status = e.status
		cfg.Resync = -1
		cfg.RetryUnfilled = 100 * time.Millisecond
	})
	run(t, c.Run)
	rep.next(t) // the pass on start: slow.key missing, creds missing
	e.put(t, creds, "first-"+secret)
	waitFile(t, filepath.Join(e.root, creds), "first-"+secret, wait)

	// From now on the helper hangs for slow.key, and its retries run it.
	if err := os.WriteFile(hang, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(wait); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(hung); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the helper was not run for slow.key again")
		}
	}
	for i := range 3 {
		content := fmt.Sprintf("put-%d-%s", i, secret)
		e.put(t, creds, content)
		d := waitFile(t, filepath.Join(e.root, creds), content, 5*time.Second)
		t.Logf("put %d -> file: %s", i, d)
	}
	// A knock's pass: the node lost creds; it is back without waiting
	// for slow.key's helper.
	if err := os.Remove(filepath.Join(e.root, creds)); err != nil {
		t.Fatal(err)
	}
	e.append(t, &events.Knock{Cause: p, Reasons: []events.KnockReason{events.KnockDeclared}, Owed: []events.Owed{}})
	d := waitFile(t, filepath.Join(e.root, creds), "put-2-"+secret, 5*time.Second)
	t.Logf("knock -> file: %s", d)
	noLeak(t, e.logs.String())
}

// A file filled from a source tried before sealed, which shadows a put,
// is tried again every RetryUnfilled as an unfilled one is: once that
// source loses the file (a deleted Vault entry), the put reaches the
// node and the shadowed status clears, without a knock or a resync (a
// fresh user's finding U9).
func TestShadowedRetried(t *testing.T) {
	e := newSealedEnv(t)
	p := e.plan(t, "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.settled(t, p)
	has := filepath.Join(t.TempDir(), "has")
	if err := os.WriteFile(has, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	x := &provision.Exec{Command: helper(t, `[ -e `+has+` ] || exit `+fmt.Sprint(provision.ExitNothing)+`
printf '%s' helper-`+secret), Log: e.logger()}
	c := e.client(t, "", nil, func(cfg *provision.Config) {
		cfg.Sources = []provision.Source{x, e.sealed(t)}
		cfg.Status = e.status
		cfg.Resync = -1
		cfg.RetryUnfilled = 100 * time.Millisecond
	})
	run(t, c.Run)
	waitFile(t, filepath.Join(e.root, creds), "helper-"+secret, wait)
	e.put(t, creds, "put-"+secret)
	e.waitStatus(t, "shadowed", func(s []store.FillStatus) bool { return len(s) == 1 && s[0].State == store.FillShadowed })
	checkFile(t, filepath.Join(e.root, creds), "helper-"+secret, 0o600)

	if err := os.Remove(has); err != nil {
		t.Fatal(err)
	}
	d := waitFile(t, filepath.Join(e.root, creds), "put-"+secret, 5*time.Second)
	t.Logf("helper lost the file -> put on the node: %s", d)
	e.waitStatus(t, "cleared", func(s []store.FillStatus) bool { return len(s) == 0 })
	noLeak(t, e.logs.String())
}
