package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
	"github.com/meshfold/meshfold/store/embedded"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestFailedApplyInPlainSight: the reason of a node's newest failed
// settle is in state and under fleet's "needs an operator", shortened
// (issue 25, item 1), not only in audit and the agent's log.
func TestFailedApplyInPlainSight(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	ctx := testCtx(t)
	snaps, err := store.OpenSnapshots(ctx, m.js, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := reconciletest.New(time.Now().Add(-time.Minute), time.Millisecond)
	s.Append("ace", &events.Want{Modules: []events.WantModule{{Name: "m", Build: "m:1", RunsAs: "m"}}})
	s.Append("ace", &events.Settle{Module: "m", Op: events.OpApply, Plan: 2})
	s.Append("ace", &events.Want{Modules: []events.WantModule{{Name: "web", Build: "sha256:" + strings.Repeat("0", 64), RunsAs: "web"}}})
	long := "fetch build sha256:000: not in bucket MESH_BUILDS: push it with meshfold build push" + strings.Repeat(" and more", 100)
	s.Append("ace", &events.Settle{Module: "web", Op: events.OpFailed, Plan: 5, Error: long})
	s.Append("ace", &events.Have{})
	data, _ := json.Marshal(s.State("ace"))
	if err := snaps.PutNode(ctx, events.Partition("ace", m.cfg.Partitions), "ace", data); err != nil {
		t.Fatal(err)
	}

	out, errOut, code := m.cli(t, "state", "ace", "--timeout", "100ms")
	if code != 0 {
		t.Fatalf("state: exit %d %s", code, errOut)
	}
	if !strings.Contains(out, "failed    apply of plan #5 failed for module web (#6") || !strings.Contains(out, "bucket MESH_BUILDS: push it") {
		t.Errorf("state does not say why the apply failed:\n%s", out)
	}
	if strings.Count(out, "and more") > 40 {
		t.Errorf("state quotes the error at full length:\n%s", out)
	}
	out, errOut, code = m.cli(t, "fleet", "--warnings", "0")
	if code != 0 {
		t.Fatalf("fleet: exit %d %s", code, errOut)
	}
	if !strings.Contains(out, "apply failed: web") || !strings.Contains(out, "apply-failed ace apply of plan #5 failed for module web") ||
		!strings.Contains(out, "bucket MESH_BUILDS: push it") || !strings.Contains(out, "1 needs an operator") {
		t.Errorf("fleet does not say why the apply failed:\n%s", out)
	}
}

// TestWantRefusesMissingBuild: want and want --dry-run refuse a sha256:
// build the builds bucket does not hold, naming it and how to push it,
// and publish nothing; --allow-missing-build publishes it; a pushed build
// passes (issue 25, item 1).
func TestWantRefusesMissingBuild(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	dir := t.TempDir()
	missing := "sha256:" + strings.Repeat("0", 64)
	wantFile := func(build string) string {
		f := filepath.Join(dir, "want.json")
		data := `{"modules":[{"name":"web","build":"` + build + `","runs_as":"web"},{"name":"img","build":"img:1","runs_as":"img"}]}`
		if err := os.WriteFile(f, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	f := wantFile(missing)
	for _, args := range [][]string{{"want", "ace", "--new", "-f", f}, {"want", "ace", "--new", "-f", f, "--dry-run"}} {
		out, errOut, code := m.cli(t, args...)
		if code == 0 || !strings.Contains(errOut, "module web") || !strings.Contains(errOut, "sha256:000000") ||
			!strings.Contains(errOut, "MESH_BUILDS") || !strings.Contains(errOut, "meshfold build push PATH") ||
			!strings.Contains(errOut, "nothing was published") {
			t.Errorf("%v: exit %d\n%s\n%s", args, code, out, errOut)
		}
	}
	if seq, err := lastWantSeq(t, m, "ace"); err != nil || seq != 0 {
		t.Fatalf("a refused want was stored: seq %d err %v", seq, err)
	}
	if _, errOut, code := m.cli(t, "want", "ace", "--new", "-f", f, "--allow-missing-build"); code != 0 {
		t.Fatalf("--allow-missing-build: exit %d %s", code, errOut)
	}
	exe := filepath.Join(dir, "web")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\nexec sleep 1000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := m.cli(t, "build", "push", exe)
	if code != 0 {
		t.Fatalf("push: %d %s", code, errOut)
	}
	if _, errOut, code := m.cli(t, "want", "ace", "--new", "-f", wantFile(strings.TrimSpace(out))); code != 0 {
		t.Fatalf("a pushed build: exit %d %s", code, errOut)
	}
}

func lastWantSeq(t *testing.T, m *mesh, node string) (uint64, error) {
	t.Helper()
	stream, err := m.js.Stream(testCtx(t), m.cfg.Name)
	if err != nil {
		return 0, err
	}
	msg, err := store.LastMsg(testCtx(t), stream, m.cfg.Subjects(), node, events.KindWant)
	if errors.Is(err, store.ErrNoMessage) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return msg.Event.Seq, nil
}

// TestConnEnv: every client command honours NATS_URL, NATS_CREDS and
// NATS_CONTEXT as the nats CLI does, a flag taking precedence (issue 25,
// item 3).
func TestConnEnv(t *testing.T) {
	// Not parallel: t.Setenv.
	m := startMesh(t)
	bare := func(args ...string) (string, string, int) {
		var out bytes.Buffer
		var errb storetest.SyncBuffer
		code := run(testCtx(t), args, nil, &out, &errb)
		return out.String(), errb.String(), code
	}
	// NATS_URL alone: no -s needed on a non-default port.
	t.Setenv("NATS_URL", m.e.ClientURL())
	if _, errOut, code := bare("build", "ls"); code != 0 {
		t.Fatalf("NATS_URL: exit %d %s", code, errOut)
	}
	// A flag wins over the variable.
	t.Setenv("NATS_URL", "nats://127.0.0.1:1")
	if _, errOut, code := bare("build", "ls", "-s", m.e.ClientURL()); code != 0 {
		t.Fatalf("-s over NATS_URL: exit %d %s", code, errOut)
	}
	if _, _, code := bare("build", "ls"); code == 0 {
		t.Fatal("NATS_URL of a closed port connected")
	}
	// NATS_CONTEXT: a context file's url.
	t.Setenv("NATS_URL", "")
	ctxFile := filepath.Join(t.TempDir(), "mesh.json")
	if err := os.WriteFile(ctxFile, []byte(`{"url":"`+m.e.ClientURL()+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NATS_CONTEXT", ctxFile)
	if _, errOut, code := bare("build", "ls"); code != 0 {
		t.Fatalf("NATS_CONTEXT: exit %d %s", code, errOut)
	}
	// NATS_CREDS: a creds file that does not exist is read, and said.
	t.Setenv("NATS_CREDS", filepath.Join(t.TempDir(), "nope.creds"))
	if _, errOut, code := bare("build", "ls"); code == 0 || !strings.Contains(errOut, "nope.creds") {
		t.Fatalf("NATS_CREDS not read: exit %d %s", code, errOut)
	}
}

// TestNoNodeFromATypo: approve naming a node with no event refuses (exit
// 2, nothing stored) unless --new; the operator verbs refuse a node with
// no want unless --new; the first want of a node says it created it
// (issue 25, item 2).
func TestNoNodeFromATypo(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	_, errOut, code := m.cli(t, "approve", "zzz-nonode", "idle", "i:1", "--by", "alice")
	if code != exitUsage || !strings.Contains(errOut, "node zzz-nonode has no event") || !strings.Contains(errOut, "--new") {
		t.Fatalf("approve of an unknown node: exit %d %s", code, errOut)
	}
	if n := nodeEvents(t, m, "zzz-nonode"); n != 0 {
		t.Fatalf("a refused approval stored %d events", n)
	}
	for _, args := range [][]string{{"retire", "zzz-nonode", "--by", "alice"}, {"pause", "zzz-nonode", "--by", "alice"}} {
		if _, errOut, code := m.cli(t, args...); code != exitUsage || !strings.Contains(errOut, "--new") {
			t.Errorf("%v: exit %d %s", args, code, errOut)
		}
	}
	if _, errOut, code := m.cli(t, "approve", "newbie", "idle", "i:1", "--by", "alice", "--new"); code != 0 {
		t.Fatalf("approve --new: exit %d %s", code, errOut)
	}
	// newbie is known now: approving again needs no --new (--ahead: it
	// has no want yet).
	if _, errOut, code := m.cli(t, "approve", "newbie", "idle", "i:2", "--by", "alice", "--ahead"); code != 0 {
		t.Fatalf("approve of a known node: exit %d %s", code, errOut)
	}
	f := filepath.Join(t.TempDir(), "w.json")
	if err := os.WriteFile(f, []byte(`{"modules":[{"name":"idle","build":"i:1","runs_as":"idle"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = m.cli(t, "want", "fresh", "--new", "-f", f)
	if code != 0 || !strings.Contains(errOut, "created node fresh") {
		t.Fatalf("first want: exit %d %q", code, errOut)
	}
	if _, errOut, code = m.cli(t, "want", "fresh", "--new", "-f", f); code != 0 || strings.Contains(errOut, "created node") {
		t.Fatalf("second want: exit %d %q", code, errOut)
	}
}

func nodeEvents(t *testing.T, m *mesh, node string) int {
	t.Helper()
	nc := m.nc
	r, err := query.New(nc, query.Config{Stream: m.cfg})
	if err != nil {
		t.Fatal(err)
	}
	n, err := r.Count(testCtx(t), node)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDeniedExplained: build push with the controller's creds fails at
// once (not after a request's timeout) and says that only the operator
// role may push builds (issue 25, item 3).
func TestDeniedExplained(t *testing.T) {
	// Not parallel: it times the denial (3 s).
	d, err := auth.Init(t.TempDir(), auth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sa, err := d.ServerAuth()
	if err != nil {
		t.Fatal(err)
	}
	e, err := embedded.Start(embedded.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:-1", Auth: sa})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	exe := filepath.Join(t.TempDir(), "web")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\nexec sleep 1000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	var errb storetest.SyncBuffer
	start := time.Now()
	code := run(testCtx(t), []string{"build", "push", exe, "-s", e.ClientURL(), "--creds", d.CredsPath("controller")}, nil, &out, &errb)
	took := time.Since(start)
	if code == 0 || !strings.Contains(errb.String(), "only the operator role may") || !strings.Contains(errb.String(), "meshfold build push") {
		t.Fatalf("build push as controller: exit %d\n%s", code, errb.String())
	}
	if took > 3*time.Second {
		t.Errorf("the denial took %s: waited out, not at once", took)
	}
	t.Logf("denied in %s: %s", took.Round(time.Millisecond), errb.String())
}

// TestOversizedExplained: the server's refusal of an oversized event is
// told by every verb as the event limit, nothing stored (issue 25, item
// 4).
func TestOversizedExplained(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	_, err := m.js.Publish(testCtx(t), m.cfg.Subjects().Event("ace", events.KindWant), make([]byte, events.MaxEventBytes+1))
	if err == nil {
		t.Fatal("an oversized event was stored")
	}
	msg := explainOversized(err).Error()
	if !strings.Contains(msg, "event limit of 262144 bytes") || !strings.Contains(msg, "nothing was stored") {
		t.Errorf("explained as %q", msg)
	}
}

// TestWantDuplicateKeys: a want naming a key twice, at any depth, is
// refused naming it (issue 25, item 8).
func TestWantDuplicateKeys(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, c := range []struct{ doc, key string }{
		{`{"modules":[],"modules":[{"name":"a","build":"a:1","runs_as":"a"}]}`, `the top object: key "modules"`},
		{`{"modules":[{"name":"a","build":"a:1","build":"a:2","runs_as":"a"}]}`, `modules[0]: key "build"`},
		{`{"modules":[{"name":"a","build":"a:1","runs_as":"a","files":[{"path":"/x","mode":"0600","mode":"0644"}]}]}`, `modules[0].files[0]: key "mode"`},
	} {
		_, err := decodeWant([]byte(c.doc), now)
		if err == nil || !strings.Contains(err.Error(), c.key) || !strings.Contains(err.Error(), "appears twice") {
			t.Errorf("%s: %v", c.doc, err)
		}
	}
	if _, err := decodeWant([]byte(`{"modules":[{"name":"a","build":"a:1","runs_as":"a"},{"name":"b","build":"b:1","runs_as":"b"}]}`), now); err != nil {
		t.Errorf("a want with no duplicate: %v", err)
	}
}

// TestWantDeepNestingRefusedCheaply: a want file of nested brackets,
// under the event limit, is refused with the JSON decoder's depth error
// at the cost of a read of the file (a fresh user's finding: a 200 KB
// file of 100,000 nested '[' held 7.8 GB after 10 minutes of `want
// --dry-run`, never answered; 30,000 took 21 s and 1.9 GB). Just under
// the decoder's depth it is walked for duplicate keys at a cost linear
// in its depth. Measured in bytes allocated, not time: not parallel, so
// the package's other tests allocate nothing meanwhile.
func TestWantDeepNestingRefusedCheaply(t *testing.T) {
	for _, c := range []struct {
		depth int
		err   string
	}{{30000, "exceeded max depth"}, {9999, "cannot unmarshal array"}} {
		doc := []byte(`{"modules":` + strings.Repeat("[", c.depth) + strings.Repeat("]", c.depth) + "}")
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := decodeWant(doc, time.Now())
		runtime.ReadMemStats(&after)
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("depth %d: %v; want an error saying %q", c.depth, err, c.err)
			continue
		}
		const most = 64 << 20
		if got := after.TotalAlloc - before.TotalAlloc; got > most {
			t.Errorf("depth %d: allocated %d MB, want at most %d MB (%v)", c.depth, got>>20, most>>20, err)
		} else {
			t.Logf("depth %d: allocated %d MB: %s", c.depth, got>>20, events.Short(err.Error()))
		}
	}
}

// TestReadmeFirstSteps: the README says the first build takes minutes
// and offers make build, whose target makes ./bin/meshfold; its plain
// nats CLI example publishes to a node of its own, not the walkthrough's
// ace, whose want it would replace (issue 25, items 6 and 7).
func TestReadmeFirstSteps(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	r := string(readme)
	if i := strings.Index(r, "## Watch it work"); i < 0 || !strings.Contains(r[:i], "make build") || !strings.Contains(r[:i], "minutes") {
		t.Error("the README's first commands do not say how long the first build takes, or offer make build")
	}
	if !regexp.MustCompile(`(?m)^build:\n\t\$\(GO\) build .*-o bin/meshfold \./cmd/meshfold$`).Match(mk) {
		t.Error("the Makefile has no build target making bin/meshfold")
	}
	for _, l := range strings.Split(r, "\n") {
		if strings.HasPrefix(l, "nats ") && strings.Contains(l, ".ace.") {
			t.Errorf("the nats CLI example names the walkthrough's node: %s", l)
		}
	}
}

// TestWriteFailedSaysWhy: an owed write-failed item shows in state with
// the node's reason (a symlink escaping the root), not only write-failed
// (issue 25, item 8).
func TestWriteFailedSaysWhy(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	ctx := testCtx(t)
	snaps, err := store.OpenSnapshots(ctx, m.js, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := reconciletest.New(time.Now().Add(-time.Minute), time.Millisecond)
	s.Append("ace", &events.Want{Modules: []events.WantModule{
		{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		{Name: "app", Build: "a:1", RunsAs: "app", Files: []events.File{{Path: "/etc/app/key", Mode: "0600"}}}}})
	s.Append("ace", &events.Settle{Module: "app", Op: events.OpApply, Plan: 2})
	s.Append("ace", &events.Refusal{Module: "app", Path: "/etc/app/key", Reason: events.ReasonWriteFailed, Plan: 2, Writer: "prov",
		Error: "openat etc/app/key: path escapes from parent"})
	data, _ := json.Marshal(s.State("ace"))
	if err := snaps.PutNode(ctx, events.Partition("ace", m.cfg.Partitions), "ace", data); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := m.cli(t, "state", "ace", "--timeout", "100ms")
	if code != 0 || !strings.Contains(out, "write-failed") || !strings.Contains(out, "why: openat") || !strings.Contains(out, "path escapes from parent") {
		t.Errorf("state: exit %d %s\n%s", code, errOut, out)
	}
}

// TestClearedWarningsDoNotFlag: a journal warning older than a node's
// newest settled plan, on a node nothing else flags, no longer puts it
// under "needs an operator"; fleet counts it apart; a newer one still
// flags the node (issue 25, item 5).
func TestClearedWarningsDoNotFlag(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	ctx := testCtx(t)
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	// The warning first (#1), then the node converges: its snapshot's
	// settled plan is #3.
	if _, err := pub.Append(ctx, "calm", events.Stamp(&events.Journal{Level: events.LevelError, Msg: "plan 2 not folded: cause 1 matches no plan", Cause: 1}, time.Now())); err != nil {
		t.Fatal(err)
	}
	snaps, err := store.OpenSnapshots(ctx, m.js, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := reconciletest.New(time.Now().Add(-time.Minute), time.Millisecond)
	s.Append("calm", &events.Journal{Level: events.LevelInfo, Msg: "pad", Cause: 1})
	s.Append("calm", &events.Want{Modules: []events.WantModule{{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true}}})
	s.Append("calm", &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: 3})
	s.Append("calm", &events.Have{})
	st := s.State("calm")
	st.Have.Time = time.Now()
	if st.Settled == nil || st.Settled.Seq != 3 {
		t.Fatalf("settled %+v", st.Settled)
	}
	data, _ := json.Marshal(st)
	if err := snaps.PutNode(ctx, events.Partition("calm", m.cfg.Partitions), "calm", data); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := m.cli(t, "fleet")
	if code != 0 || !strings.Contains(out, "0 need an operator") || !strings.Contains(out, "1 journal warning cleared") {
		t.Fatalf("an old warning on a converged node: exit %d %s\n%s", code, errOut, out)
	}
	// A warning after the settled plan flags it.
	for range 3 {
		if _, err := pub.Append(ctx, "calm", events.Stamp(&events.Journal{Level: events.LevelWarn, Msg: "new", Cause: 1}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	out, _, _ = m.cli(t, "fleet")
	if !strings.Contains(out, "1 needs an operator") || !strings.Contains(out, " warnings\n") {
		t.Errorf("a newer warning does not flag the node:\n%s", out)
	}
}

// TestReadmeSealedProvisionerUnderW: the README's walkthrough promises that
// everything it writes goes under $W, and its clean-up removes $W; a
// provisioner started with --from sealed and no --key writes its curve key
// machine-wide (/var/lib/meshfold/provisioner-ace/curve.key as root), which
// the clean-up left behind and a second walkthrough reused (a fresh user's
// finding U2). Every README command of such a provisioner gives --key
// under $W.
func TestReadmeSealedProvisionerUnderW(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, seg := range strings.Split(string(readme), "`") {
		flat := strings.Join(strings.Fields(seg), " ")
		for _, c := range strings.Split(flat, "meshfold ")[1:] {
			if !strings.HasPrefix(c, "provision ") || !strings.Contains(c, "--from sealed") {
				continue
			}
			n++
			if !regexp.MustCompile(`--key \$W/\S`).MatchString(c) {
				t.Errorf("the README starts a sealed provisioner without --key under $W (its curve key lands outside the scratch directory): %q", c)
			}
		}
		if strings.HasPrefix(flat, "provision ") && strings.Contains(flat, "--from sealed") {
			n++
			if !regexp.MustCompile(`--key \$W/\S`).MatchString(flat) {
				t.Errorf("the README starts a sealed provisioner without --key under $W (its curve key lands outside the scratch directory): %q", flat)
			}
		}
	}
	if n == 0 {
		t.Fatal("the README starts no provisioner with --from sealed: the walkthrough's sealed step is gone?")
	}
	if !strings.Contains(string(readme), "remove the scratch directory, `rm -rf $W`") {
		t.Error("the README's clean-up does not say to remove $W")
	}
}
