package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

func TestDidYouMean(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s     string
		known []string
		want  string
	}{
		{"natz", []string{"nats", "web"}, ` (did you mean nats?)`},
		{"mesh-bild-go", []string{"provisioner", "mesh-build-go"}, ` (did you mean mesh-build-go?)`},
		{"/run/mesh-build-go/broker.cred", []string{"/run/mesh-build-go/broker.creds"}, ` (did you mean /run/mesh-build-go/broker.creds?)`},
		{"Nats", []string{"nats"}, ` (did you mean nats?)`},
		{"pg", []string{"nats", "web"}, ""}, // nothing near
		{"ab", []string{"ax", "ay"}, ""},    // two as near: no guess
		{"nats", []string{"nats"}, ""},      // itself is no suggestion
		{"sealed", []string{"sealed"}, ""},  // idem
		{"seald", []string{"sealed"}, ` (did you mean sealed?)`},
		{"x", nil, ""},
	} {
		if got := didYouMean(tc.s, tc.known); got != tc.want {
			t.Errorf("didYouMean(%q, %q) = %q, want %q", tc.s, tc.known, got, tc.want)
		}
	}
}

// approve, revoke and waive of a module or path the node's newest want does not
// declare are refused (exit 2, nothing published), naming what it
// declares and the near name; --ahead publishes them (a fresh user's
// finding U17: published with a note, exit 0).
func TestApproveWaiveRefuseUndeclared(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	for _, n := range []string{"ace", "bob"} {
		if code, _, stderr := c.run(t, "", "want", n, "--new", "-f", writeWantFile(t, goodWant)); code != 0 {
			t.Fatalf("want %s: %s", n, stderr)
		}
	}
	msgs := func() uint64 {
		t.Helper()
		i, err := c.stream.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return i.State.Msgs
	}
	for _, tc := range []struct {
		args []string
		says []string
	}{
		{[]string{"approve", "ace", "mesh-bild-go", "g:2", "--by", "alice"},
			[]string{"node ace's newest want (#1) declares no module mesh-bild-go (did you mean mesh-build-go?); it declares provisioner, mesh-build-go", "nothing published", "--ahead"}},
		{[]string{"approve", "ace", "bob", "natz", "g:2", "--by", "alice"},
			[]string{"node ace's newest want (#1) declares no module natz; it declares", "node bob's newest want (#2) declares no module natz", "nothing published"}},
		{[]string{"approve", "--all", "natz", "g:2", "--by", "alice"},
			[]string{"approve --all: no node's newest want declares module natz: nothing published", "--ahead"}},
		{[]string{"waive", "ace", "mesh-build-go", "/run/mesh-build-go/broker.cred", "--by", "alice"},
			[]string{`declares no file /run/mesh-build-go/broker.cred for module mesh-build-go (did you mean /run/mesh-build-go/broker.creds?)`, "nothing published", "--ahead"}},
		{[]string{"waive", "ace", "mesh-buidl-go", "/run/mesh-build-go/broker.creds", "--by", "alice"},
			[]string{"declares no module mesh-buidl-go (did you mean mesh-build-go?)"}},
		// revoke as approve: a mistyped module left the approval in force,
		// the revoke stored, exit 0.
		{[]string{"revoke", "ace", "mesh-bild-go", "g:2", "--by", "alice"},
			[]string{"node ace's newest want (#1) declares no module mesh-bild-go (did you mean mesh-build-go?); it declares provisioner, mesh-build-go",
				"nothing published (is the name mistyped? --ahead publishes the revoke ahead of a want that declares it)"}},
	} {
		before := msgs()
		code, stdout, stderr := c.run(t, "", tc.args...)
		if code != exitUsage || stdout != "" {
			t.Errorf("%v: exit %d, stdout %q; want %d and nothing printed\n%s", tc.args, code, stdout, exitUsage, stderr)
		}
		for _, w := range tc.says {
			if !strings.Contains(stderr, w) {
				t.Errorf("%v: stderr does not say %q:\n%s", tc.args, w, stderr)
			}
		}
		if n := msgs(); n != before {
			t.Errorf("%v: %d events published", tc.args, n-before)
		}
	}
	// What the want declares is taken; so is --all of a module some node's
	// want names, and anything with --ahead (a note says why it moves
	// nothing now).
	for _, args := range [][]string{
		{"approve", "ace", "mesh-build-go", "g:2", "--by", "alice"},
		{"approve", "--all", "mesh-build-go", "g:2", "--by", "alice"},
		{"waive", "ace", "mesh-build-go", "/run/mesh-build-go/broker.creds", "--by", "alice"},
		{"approve", "ace", "natz", "g:2", "--by", "alice", "--ahead"},
		{"waive", "ace", "mesh-build-go", "/run/mesh-build-go/broker.cred", "--by", "alice", "--ahead"},
		{"revoke", "ace", "mesh-build-go", "g:2", "--by", "alice"},
		{"revoke", "ace", "natz", "g:2", "--by", "alice", "--ahead"},
	} {
		if code, stdout, stderr := c.run(t, "", args...); code != 0 || !strings.Contains(stdout, ": stream sequence ") {
			t.Errorf("%v: exit %d, %q %q", args, code, stdout, stderr)
		}
	}
	m, ok := c.last(t, "ace", events.KindApprove)
	if !ok || m.Event.Payload.(*events.Approve).Module != "natz" {
		t.Errorf("approve --ahead stored no approval of natz: %+v", m.Event.Payload)
	}
}

// secret put of a module or path node ace's newest want does not declare
// is refused (exit 2, nothing stored, no revision moved), naming what it
// declares and the near name; --ahead stores it with a note (a fresh
// user's finding U4: stored with a warning, exit 0).
func TestSecretPutRefusesUndeclared(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	ctx := testCtx(t)
	if _, errs, code := m.cli(t, "want", "ace", "--new", "-f", writeWantFile(t, goodWant)); code != 0 {
		t.Fatalf("want: %s", errs)
	}
	f := filepath.Join(t.TempDir(), "c")
	if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// No key registered yet: refused (exit 1), the bucket created.
	if _, errs, code := m.cli(t, "secret", "put", "ace", "mesh-build-go", "/run/mesh-build-go/broker.creds", "-f", f, "--by", "t"); code != exitError {
		t.Fatalf("put with no key: exit %d %s", code, errs)
	}
	kv, err := m.js.KeyValue(ctx, m.cfg.Name+store.SecretsBucketSuffix)
	if err != nil {
		t.Fatal(err)
	}
	curve, err := nkeys.CreateCurveKeys()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := curve.PublicKey()
	for _, n := range []string{"ace", "bob"} {
		if _, err := kv.Put(ctx, store.CurveKeyName(n), []byte(pub)); err != nil {
			t.Fatal(err)
		}
	}
	// bob: a provisioner registered its key, no want yet.
	if _, errs, code := m.cli(t, "pause", "bob", "--by", "t", "--new"); code != 0 {
		t.Fatalf("pause bob: %s", errs)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rev := st.Values()
	for _, tc := range []struct {
		node, module, path string
		says               string
	}{
		{"ace", "mesh-bild-go", "/run/mesh-build-go/broker.creds", "node ace's newest want (#1) declares no module mesh-bild-go (did you mean mesh-build-go?); it declares provisioner, mesh-build-go"},
		{"ace", "mesh-build-go", "/run/mesh-build-go/broker.cred", "declares no file /run/mesh-build-go/broker.cred for module mesh-build-go (did you mean /run/mesh-build-go/broker.creds?); it declares /run/mesh-build-go/broker.creds"},
		{"bob", "mesh-build-go", "/run/mesh-build-go/broker.creds", "node bob has no want yet"},
	} {
		out, errs, code := m.cli(t, "secret", "put", tc.node, tc.module, tc.path, "-f", f, "--by", "t")
		if code != exitUsage || out != "" || !strings.Contains(errs, tc.says) || !strings.Contains(errs, "nothing stored") || !strings.Contains(errs, "--ahead") {
			t.Errorf("put %s %s %s: exit %d, stdout %q; want %d saying %q\n%s", tc.node, tc.module, tc.path, code, out, exitUsage, tc.says, errs)
		}
		if _, err := kv.Get(ctx, store.SecretKey(tc.node, tc.module, tc.path)); err == nil {
			t.Errorf("put %s %s %s: stored", tc.node, tc.module, tc.path)
		}
	}
	if st, err := kv.Status(ctx); err != nil {
		t.Fatal(err)
	} else if st.Values() != rev {
		t.Errorf("refused puts moved the bucket: %d values, was %d", st.Values(), rev)
	}
	// ls of a node with no secret says its count, as every list does (a
	// fresh user's finding U10: a bare header).
	if out, errs, code := m.cli(t, "secret", "ls", "ace"); code != 0 || !strings.HasSuffix(out, "\n-- 0 secrets of ace\n") {
		t.Errorf("secret ls of a node with none: exit %d %q %q", code, out, errs)
	}
	out, errs, code := m.cli(t, "secret", "put", "ace", "mesh-build-go", "/run/mesh-build-go/broker.creds", "-f", f, "--by", "t")
	if code != 0 || !strings.Contains(out, "revision") {
		t.Errorf("put of the declared file: exit %d %q %q", code, out, errs)
	}
	if out, errs, code := m.cli(t, "secret", "ls", "ace"); code != 0 || !strings.HasSuffix(out, "\n-- 1 secret of ace\n") {
		t.Errorf("secret ls of a node with one: exit %d %q %q", code, out, errs)
	}
	out, errs, code = m.cli(t, "secret", "put", "bob", "mesh-build-go", "/run/mesh-build-go/broker.creds", "-f", f, "--by", "t", "--ahead")
	if code != 0 || !strings.Contains(out, "revision") || !strings.Contains(errs, "note: node bob has no want yet: stored ahead of it") {
		t.Errorf("put --ahead: exit %d %q %q", code, out, errs)
	}
}

// retire --force of a node the stream holds events of but never a want
// (a provisioner started under a mistyped name: a phantom fleet lists)
// retires it; without --force the refusal says so and names --force; a
// name the stream holds nothing of still needs --new (a fresh user's
// finding U15: --force was refused as "no want", and needed --new).
func TestRetireForceOfAPhantom(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	p := &events.Prov{Agent: events.Agent{State: events.AgentUp, Claim: "c1", Host: "h", PID: 42}}
	if _, err := store.NewPublisher(c.js, c.cfg.Subjects()).Append(context.Background(), "gus", events.Stamp(p, time.Now())); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := c.run(t, "", "retire", "gus", "--by", "alice")
	if code != exitUsage || stdout != "" || !strings.Contains(stderr, "node gus has events in stream") || !strings.Contains(stderr, "(1 prov) but never a want") ||
		!strings.Contains(stderr, "'meshfold retire gus --force --by NAME' retires it at once") {
		t.Errorf("retire of a phantom: exit %d, %q %q", code, stdout, stderr)
	}
	if _, ok := c.last(t, "gus", events.KindRetire); ok {
		t.Error("a refused retire was published")
	}
	code, stdout, stderr = c.run(t, "", "retire", "gus", "--by", "alice", "--force")
	if code != 0 || !strings.HasPrefix(stdout, "retire gus: stream sequence ") {
		t.Errorf("retire --force of a phantom: exit %d, %q %q", code, stdout, stderr)
	}
	if m, ok := c.last(t, "gus", events.KindRetire); !ok || !m.Event.Payload.(*events.Retire).Force {
		t.Error("no forced retire of gus stored")
	}
	if code, _, stderr := c.run(t, "", "retire", "guss", "--by", "alice", "--force"); code != exitUsage || !strings.Contains(stderr, "node guss has no event in stream") {
		t.Errorf("retire --force of a name the stream holds nothing of: exit %d, %q", code, stderr)
	}
}

// provision refuses at start, exit 2, an exec: helper whose first word is
// not found or not executable, and says "did you mean sealed?" of a slip
// of it (a fresh user's finding U15: exec:/nonexistent/helper started and
// logged nothing until a file was declared). No server is reached.
func TestProvisionChecksItsSourcesAtStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	helper := filepath.Join(dir, "helper")
	if err := os.WriteFile(helper, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ from, says string }{
		{"exec:/nonexistent/helper", "--from exec:/nonexistent/helper: the helper /nonexistent/helper: stat /nonexistent/helper: no such file or directory"},
		{"exec:" + plain + " --flag", "the helper " + plain + " is not executable (mode 0644)"},
		{"exec:" + dir, "the helper " + dir + " is not a file"},
		{"exec:no-such-helper-anywhere arg", "no-such-helper-anywhere is not found in $PATH"},
		{"seald", "stat seald: no such file or directory (did you mean sealed?)"},
		{plain, "not a directory (nor exec:CMD, nor sealed)"},
	} {
		var out, errb bytes.Buffer
		code := run(testCtx(t), []string{"provision", "gus", "--from", tc.from, "--account", "nobody", "--trust", filepath.Join(dir, "none.pub"),
			"-s", "nats://127.0.0.1:1"}, nil, &out, &errb)
		if code != exitUsage || !strings.Contains(errb.String(), tc.says) {
			t.Errorf("--from %s: exit %d, want %d saying %q:\n%s", tc.from, code, exitUsage, tc.says, errb.String())
		}
	}
	for _, from := range []string{"sealed", dir, "exec:" + helper + " --x", "exec:sh -c 'x'", "exec:VAR=1 /nonexistent", "exec:exec /bin/true"} {
		if err := checkFrom(from); err != nil {
			t.Errorf("checkFrom(%q): %v", from, err)
		}
	}
}
