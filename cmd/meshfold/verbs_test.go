package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/embedded"
	"github.com/meshfold/meshfold/store/storetest"
)

type verbCLI struct {
	url    string
	js     jetstream.JetStream
	stream jetstream.Stream
	cfg    store.StreamConfig
}

func newVerbCLI(t *testing.T) *verbCLI {
	t.Helper()
	e, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	return &verbCLI{url: e.ClientURL(), js: js, stream: stream, cfg: cfg}
}

// run runs the CLI with args against the test server.
func (c *verbCLI) run(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	args = append(args, "-s", c.url, "--log-level", "warn")
	code = run(ctx, args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func (c *verbCLI) last(t *testing.T, node string, kind events.Kind) (store.Msg, bool) {
	t.Helper()
	m, err := store.LastMsg(context.Background(), c.stream, c.cfg.Subjects(), node, kind)
	if err != nil {
		return m, false
	}
	return m, true
}

func writeWantFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "want.json")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// seqOf reads the sequence the verbs print: "...: stream sequence N".
func printedSeq(t *testing.T, stdout string) uint64 {
	t.Helper()
	_, after, ok := strings.Cut(strings.TrimSpace(stdout), "stream sequence ")
	n, err := strconv.ParseUint(after, 10, 64)
	if !ok || err != nil {
		t.Fatalf("no sequence in %q", stdout)
	}
	return n
}

// manyModules returns n module declarations.
func manyModules(n int) string {
	ms := make([]string, n)
	for i := range ms {
		ms[i] = fmt.Sprintf(`{"name": "m%d", "build": "b"}`, i)
	}
	return strings.Join(ms, ",")
}

const goodWant = `{"modules": [
  {"name": "provisioner", "build": "p:1", "runs_as": "prov", "provisioner": true},
  {"name": "mesh-build-go", "build": "g:1", "runs_as": "mbg",
   "files": [{"path": "/run/mesh-build-go/broker.creds", "mode": "0600"}]}
]}`

// Bad input is refused before anything is published, and the error names
// the field: a typo (unknown field), a relative path, a bad node name.
func TestWantRefusesBadInput(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	for _, tc := range []struct {
		name, node, file, want string
	}{
		{"unknown field", "ace", `{"modules": [{"name": "a", "bulid": "x"}]}`, `"bulid"`},
		{"relative path", "ace", `{"modules": [{"name": "a", "build": "x", "files": [{"path": "etc/a", "mode": "0600"}]}]}`, "modules[0].files[0].path"},
		{"bad mode", "ace", `{"modules": [{"name": "a", "build": "x", "files": [{"path": "/etc/a", "mode": "600x"}]}]}`, "modules[0].files[0].mode"},
		{"two provisioners", "ace", `{"modules": [{"name": "a", "build": "x", "provisioner": true}, {"name": "b", "build": "y", "provisioner": true}]}`, "modules[1].provisioner"},
		{"newer version", "ace", `{"v": 2, "modules": []}`, "newer schema version"},
		{"not an object", "ace", `[1]`, "not a JSON object"},
		{"no modules key", "ace", `{}`, "modules: required"},
		{"setuid world-writable mode", "ace", `{"modules": [{"name": "a", "build": "x", "files": [{"path": "/etc/a", "mode": "4777"}]}]}`, "modules[0].files[0].mode"},
		{"misspelt modules", "ace", `{"modlues": []}`, `"modlues"`},
		{"bad node", "Ace", goodWant, "NODE"},
		{"oversized file", "ace", `{"modules": [], "pad": "` + strings.Repeat(" ", events.MaxEventBytes) + `"}`, "events.MaxEventBytes"},
		{"too many modules", "ace", `{"modules": [` + manyModules(events.MaxModules+1) + `]}`, "the limit is 32 (events.MaxModules)"},
		{"null modules", "ace", `{"modules": null}`, "modules: required"},
		{"runs_as a command", "ace", `{"modules": [{"name": "a", "build": "x", "runs_as": "root; rm -rf /"}]}`, "modules[0].runs_as"},
		{"build with a newline", "ace", `{"modules": [{"name": "a", "build": "x\ny"}]}`, "modules[0].build"},
		{"reserved path", "ace", `{"modules": [{"name": "a", "build": "x", "files": [{"path": "/.meshfold/modules/a", "mode": "0600"}]}]}`, "reserved directory"},
		{"at not UTC", "ace", `{"at": "2026-12-01T12:00:00+01:00", "modules": []}`, "UTC"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := c.run(t, "", "want", tc.node, "--new", "-f", writeWantFile(t, tc.file))
			if code != exitUsage || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want %d naming %s", code, stderr, exitUsage, tc.want)
			}
		})
	}
	if _, ok := c.last(t, "ace", events.KindWant); ok {
		t.Error("a want was published")
	}
}

// A good want is published with v and at filled in and its sequence
// printed; a stale --expect fails with exit code 3 and names the current
// sequence; a current one succeeds.
func TestWantPublishAndExpect(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	before := time.Now().UTC().Add(-time.Second)
	code, stdout, stderr := c.run(t, "", "want", "ace", "--new", "-f", writeWantFile(t, goodWant))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	seq := printedSeq(t, stdout)
	m, ok := c.last(t, "ace", events.KindWant)
	if !ok || m.Event.Seq != seq || m.Event.Err != nil {
		t.Fatalf("stream's newest want %+v, printed %d", m.Event, seq)
	}
	w := m.Event.Payload.(*events.Want)
	if w.V != events.Version || w.At.Before(before) || len(w.Modules) != 2 {
		t.Errorf("want = %+v: v and at not filled in", w)
	}

	code, _, stderr = c.run(t, "", "want", "ace", "--new", "-f", writeWantFile(t, goodWant), "--expect", "0")
	if code != exitConflict || !strings.Contains(stderr, "conflict") || !strings.Contains(stderr, "sequence "+strconv.FormatUint(seq, 10)) {
		t.Fatalf("stale --expect: exit %d, stderr %q; want %d naming sequence %d", code, stderr, exitConflict, seq)
	}
	if m, _ := c.last(t, "ace", events.KindWant); m.Event.Seq != seq {
		t.Fatalf("a stale --expect published")
	}

	code, stdout, stderr = c.run(t, `{"v": 1, "at": "2026-01-02T03:04:05Z", "modules": []}`, "want", "ace", "--new", "-f", "-", "--expect", strconv.FormatUint(seq, 10))
	if code != 0 {
		t.Fatalf("current --expect: exit %d: %s", code, stderr)
	}
	m, _ = c.last(t, "ace", events.KindWant)
	if m.Event.Seq != printedSeq(t, stdout) || !m.Event.Payload.(*events.Want).At.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Errorf("want from stdin: %+v", m.Event)
	}
}

// approve prints the sequence it got; bad input is refused naming the
// field.
func TestApprove(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	code, stdout, stderr := c.run(t, "", "approve", "novox", "nats", "img:2.10", "--by", "alice", "--new")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	m, ok := c.last(t, "novox", events.KindApprove)
	if !ok || m.Event.Seq != printedSeq(t, stdout) {
		t.Fatalf("printed %q, stream has %+v", stdout, m.Event)
	}
	if a := m.Event.Payload.(*events.Approve); a.Module != "nats" || a.Build != "img:2.10" || a.By != "alice" {
		t.Errorf("approve = %+v", a)
	}
	// Stored either way (an approval may precede its want), with a note
	// on stderr when no want of the node names the module.
	if !strings.Contains(stderr, "novox has no want yet") {
		t.Errorf("approval before any want: stderr %q lacks the note", stderr)
	}
	// Against the node's want: another build than the wanted one, or a
	// module not gated, gets a note; the pending one none (a fresh
	// user's finding L14).
	if code, _, stderr := c.run(t, `{"modules":[{"name":"nats","build":"img:2.10","requires_approval":true},{"name":"web","build":"img:web"}]}`,
		"want", "novox", "-f", "-"); code != 0 {
		t.Fatalf("want: exit %d: %s", code, stderr)
	}
	for _, tc := range []struct{ module, build, note string }{
		{"nats", "img:2.11", "node novox's newest want (#"},
		{"nats", "img:2.11", "names nats at img:2.10, not img:2.11: this approval moves nothing now"},
		{"web", "img:web", "does not require an approval of web: nothing waits for this one"},
		{"nats", "img:2.10", ""},
	} {
		code, _, stderr := c.run(t, "", "approve", "novox", tc.module, tc.build, "--by", "alice")
		if code != 0 || tc.note != "" && !strings.Contains(stderr, "note: "+tc.note) && !strings.Contains(stderr, tc.note) || tc.note == "" && strings.Contains(stderr, "note:") {
			t.Errorf("approve novox %s %s: exit %d, stderr %q, want the note %q", tc.module, tc.build, code, stderr, tc.note)
		}
	}
	code, _, stderr = c.run(t, "", "approve", "novox", "NATS!", "img:2.10", "--by", "alice")
	if code != exitUsage || !strings.Contains(stderr, "module") {
		t.Errorf("bad module: exit %d, %q", code, stderr)
	}
	code, _, stderr = c.run(t, "", "approve", "novox", "nats", "img:2.10", "--by", "")
	if code == 0 || !strings.Contains(stderr, "by") {
		t.Errorf("empty --by: exit %d, %q", code, stderr)
	}
	if m2, _ := c.last(t, "novox", events.KindApprove); m2.Event.Payload.(*events.Approve).Build != "img:2.10" {
		t.Error("a bad approval was published")
	}
}

// The node and provision verbs wire the libraries: a plan's file lands
// under --root from --from.
func TestNodeAndProvisionVerbs(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	dir := t.TempDir()
	root, state, from := filepath.Join(dir, "root"), filepath.Join(dir, "state"), filepath.Join(dir, "from")
	src := filepath.Join(from, "mesh-build-go", "run", "mesh-build-go", "broker.creds")
	if err := os.MkdirAll(filepath.Dir(src), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src, []byte("token"), 0o600); err != nil {
		t.Fatal(err)
	}
	pub := store.NewPublisher(c.js, c.cfg.Subjects())
	// The want the plan composes, before it: a plan's cause is below its
	// own sequence, or the agent refuses it.
	w, err := pub.Append(context.Background(), "ace", events.Stamp(&events.Want{Modules: []events.WantModule{}}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	plan := events.Stamp(&events.Plan{Cause: w.Seq, Want: w.Seq, ProvisionerAccount: "prov", Modules: []events.PlanModule{
		{Name: "mesh-build-go", Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: "/run/mesh-build-go/broker.creds", Mode: "0600"}}}}}, time.Now())
	signer, trust := testSigner(t)
	if _, err := pub.Append(context.Background(), "ace", plan, store.WithMsgID(fmt.Sprintf("ace.plan.%d.0", w.Seq)), store.WithSigner(signer)); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 2)
	var out storetest.SyncBuffer // the node and the provisioner write it at once
	go func() {
		done <- run(ctx, []string{"node", "ace", "--runtime", "record", "--root", root, "--state-dir", state, "-s", c.url, "--log-level", "error", "--trust", trust}, nil, &out, &out)
	}()
	go func() {
		done <- run(ctx, []string{"provision", "ace", "--from", from, "--account", "prov", "-s", c.url, "--log-level", "error", "--trust", trust}, nil, &out, &out)
	}()
	defer func() {
		cancel()
		for range 2 {
			if code := <-done; code != 0 {
				t.Errorf("a verb exited %d", code)
			}
		}
	}()
	// Wait for the filled event, then check the file.
	cons, err := c.js.OrderedConsumer(ctx, c.cfg.Name, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{c.cfg.Subjects().Stored("ace", events.KindFilled)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second)); err != nil {
		t.Fatalf("no filled event: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(root, "run", "mesh-build-go", "broker.creds"))
	if err != nil || string(b) != "token" {
		t.Fatalf("file = %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(root, ".meshfold", "modules", "mesh-build-go.json")); err != nil {
		t.Errorf("runtime record: %v", err)
	}
}

// The demo without --dir ends saying that it removed its temporary
// directory, and how to keep one to audit (a fresh user's finding U27:
// the --why it printed read a directory then gone); it is gone.
func TestDemoSaysItRemovedItsDir(t *testing.T) {
	// Not parallel: t.Setenv.
	tmp := t.TempDir()
	for _, d := range []string{filepath.Dir(tmp), tmp} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("TMPDIR", tmp)
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if code := run(ctx, []string{"demo"}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errb.String(), out.String())
	}
	m := regexp.MustCompile(`\nremoved (` + regexp.QuoteMeta(tmp) + `/meshfold-demo-\d+); ` + "`meshfold demo --dir DIR` keeps it to audit\n$").FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("the demo's last line does not say it removed its directory:\n%s", out.String())
	}
	if _, err := os.Stat(m[1]); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s after the demo: %v", m[1], err)
	}
}

// The demo plays incident 1 to its end: the file written, the knock that
// caused it explained.
func TestDemo(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// Modules may run as nobody: the test's temporary directories must let
	// them through.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if code := run(ctx, []string{"demo", "--dir", dir}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errb.String(), out.String())
	}
	for _, want := range []string{"meshfold build push mesh-build-go → sha256:", "refusal", "knock", "filled",
		"file written: " + filepath.Join(dir, "ace-root", "run", "mesh-build-go", "broker.creds"),
		"mode 0600", "because of knock #", "due       settled plan",
		"+mesh-build-go sha256:", "failed (status 1", "mesh-build-go failed→running",
		"meshfold logs ace mesh-build-go", "missing broker credential", "broker credential found"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	// The demo prints the --why command with the knock's own sequence,
	// the one on the knock's timeline line.
	if m := regexp.MustCompile(`because of knock #(\d+) \(meshfold audit ace --why (\d+)\)`).FindStringSubmatch(out.String()); m == nil || m[1] != m[2] ||
		!regexp.MustCompile(`(?m)^\s+`+m[1]+` \S+ knock `).MatchString(out.String()) {
		t.Errorf("no --why command naming the knock's timeline sequence:\n%s", out.String())
	}
	if strings.Contains(out.String(), "demo broker credential") {
		t.Error("the demo printed the content")
	}
	// A second run in the same directory is refused, before it starts
	// anything: it would append to this run's stream (a fresh user's
	// finding U27).
	var out2 bytes.Buffer
	var errb2 storetest.SyncBuffer
	if code := run(ctx, []string{"demo", "--dir", dir}, nil, &out2, &errb2); code != exitUsage ||
		!regexp.MustCompile(`^meshfold: --dir: `+regexp.QuoteMeta(dir)+` holds a demo from \d{4}-\d\d-\d\d \d\d:\d\d: give a new --dir or remove it\n$`).MatchString(errb2.String()) ||
		out2.Len() != 0 {
		t.Errorf("second demo in %s: exit %d\n%s\n%s", dir, code, errb2.String(), out2.String())
	}

	// The stream the demo leaves ends as the demo did: its modules
	// stopped (a have after a want of none), then its agent's down
	// (released), recorded by the demo's own reconciler; a serve on
	// DIR/nats has nothing left to record and no module to show running.
	e, err := embedded.Start(embedded.Config{DataDir: filepath.Join(dir, "nats"), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown()
	nc, err := e.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := store.StreamConfig{}.WithDefaults()
	var tail []events.Event
	if err := store.ReadNode(ctx, js, cfg.Name, cfg.Subjects(), "ace", 0, 0, func(m store.Msg) error {
		tail = append(tail, m.Event)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(tail) < 2 {
		t.Fatalf("ace's stream holds %d events", len(tail))
	}
	// The empty plan's settle may be stored after the have of its
	// stopped modules (seen under CI's load): the newest have is what
	// must say nothing runs.
	var h *events.Have
	for _, ev := range slices.Backward(tail) {
		if hv, ok := ev.Payload.(*events.Have); ok {
			h = hv
			break
		}
	}
	ag, okAgent := tail[len(tail)-1].Payload.(*events.Agent)
	if h == nil || slices.ContainsFunc(h.Modules, func(hm events.HaveModule) bool { return hm.State != events.Stopped }) ||
		!okAgent || ag.State != events.AgentDown || ag.Why != events.WhyReleased {
		t.Errorf("ace's stream ends with %s then %s (newest have %+v), want its newest have to run no module and the agent's down (released) last",
			tail[len(tail)-2].Kind, tail[len(tail)-1].Kind, h)
	}
	// A new user's first audit shows no alarm that is not true (a fresh
	// user's finding 3b): the demo's provisioner answered the knock it
	// filled on (fleet said "no provisioner of ace has recorded an
	// answer"), and its teardown, a want of none, journals no warning
	// ("the node will refuse every filled write").
	var knock uint64
	for _, ev := range tail {
		if ev.Kind == events.KindKnock {
			knock = ev.Seq
		}
		if j, ok := ev.Payload.(*events.Journal); ok && j.Level != events.LevelInfo {
			t.Errorf("the demo's stream holds journal #%d at %s: %s", ev.Seq, j.Level, j.Msg)
		}
	}
	kv, err := store.OpenFillStatus(ctx, js, cfg, false)
	if err != nil {
		t.Fatalf("no fill status bucket: %v", err)
	}
	if ans, ok, err := store.GetKnockAnswer(ctx, kv, "ace"); err != nil || !ok || knock == 0 || ans.Knock < knock {
		t.Errorf("the demo's provisioner did not answer ace's knock #%d: %+v %v %v", knock, ans, ok, err)
	}
}

// The long-running roles start in any order: a node agent started before
// its NATS server waits for it, then for the reconciler's stream, then
// runs.
func TestNodeWaitsForTheServer(t *testing.T) {
	t.Parallel()
	addr := storetest.FreeAddr(t)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	errb := &storetest.SyncBuffer{}
	done := make(chan int, 1)
	_, trust := testSigner(t) // here: t.Fatal must not run in the goroutine
	go func() {
		done <- run(ctx, []string{"node", "ace", "--runtime", "record", "--root", filepath.Join(dir, "root"), "--state-dir", filepath.Join(dir, "state"),
			"-s", "nats://" + addr, "--trust", trust}, nil, &storetest.SyncBuffer{}, errb)
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("node exited %d: %s", code, errb.String())
		}
	}()
	deadline := time.Now().Add(20 * time.Second) // for the three waits together
	waitFor := func(what string) {
		t.Helper()
		waitfor.Value(t, time.Until(deadline), fmt.Sprintf("%q in the node's log", what), func() (string, bool) {
			log := errb.String()
			return log, strings.Contains(log, what)
		})
	}
	waitFor("NATS not reachable yet; retrying")
	srv, err := embedded.Start(embedded.Config{DataDir: filepath.Join(dir, "data"), Listen: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	waitFor("the event stream does not exist yet")
	if _, _, err := store.EnsureStream(context.Background(), js, store.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	waitFor("node agent running")
}

// A long-running role whose first connection the server drops before it
// answers (a server under load whose 2 s auth timeout ran out while the
// handshake waited: TestRevokedRolesExit's provisioner exited with
// "write: broken pipe" at load 40) tries again, as it does when no
// server listens, instead of exiting.
func TestNodeRetriesADroppedHandshake(t *testing.T) {
	t.Parallel()
	addr := storetest.FreeAddr(t)
	dir := t.TempDir()
	// A server that drops every connection after its INFO.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	dropped := make(chan struct{})
	go func() {
		defer close(dropped)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(`INFO {"server_id":"x","version":"2.15.2","proto":1,"headers":true,"max_payload":1048576}` + "\r\n"))
			_ = c.Close()
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	errb := &storetest.SyncBuffer{}
	done := make(chan int, 1)
	_, trust := testSigner(t)
	go func() {
		done <- run(ctx, []string{"node", "ace", "--runtime", "record", "--root", filepath.Join(dir, "root"), "--state-dir", filepath.Join(dir, "state"),
			"-s", "nats://" + addr, "--trust", trust}, nil, &storetest.SyncBuffer{}, errb)
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("node exited %d: %s", code, errb.String())
		}
	}()
	waitfor.Value(t, 20*time.Second, "the node's retry of a dropped handshake", func() (string, bool) {
		log := errb.String()
		return log, strings.Contains(log, "NATS not reachable yet; retrying")
	})
	ln.Close()
	<-dropped
	srv, err := embedded.Start(embedded.Config{DataDir: filepath.Join(dir, "data"), Listen: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.EnsureStream(context.Background(), js, store.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	waitfor.Value(t, 20*time.Second, "the node running", func() (string, bool) {
		log := errb.String()
		return log, strings.Contains(log, "node agent running")
	})
}

// Flag values no run could mean are usage errors (exit 2), said before
// anything connects: no server listens on the address given.
func TestBadFlagValues(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	for _, c := range []struct {
		args []string
		say  string
	}{
		{[]string{"audit", "ace", "--why", "0"}, "--why 0"},
		{[]string{"fleet", "--stale", "-5s"}, "--stale -5s"},
		{[]string{"fleet", "--warnings", "-1h"}, "--warnings -1h0m0s"},
		{[]string{"provision", "ace", "--from", t.TempDir(), "--account", "bad user"}, `--account "bad user"`},
		{[]string{"provision", "ace", "--from", t.TempDir(), "--account", "Prov"}, `--account "Prov"`},
	} {
		code, _, errs := runCLI(ctx, append(c.args, "-s", "nats://127.0.0.1:1")...)
		if code != exitUsage || !strings.Contains(errs, c.say) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, errs, c.say)
		}
	}
}

// A want whose "at" is far ahead of this machine's clock is published
// with a note on stderr; one in the past, or left out, gets none (a
// fresh user's finding L11: 2036 was taken without a word).
func TestWantAtAheadIsNoted(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	for _, tc := range []struct {
		want string
		note bool
	}{
		{`{"at": "2036-01-01T00:00:00Z", "modules": []}`, true},
		{`{"at": "2026-01-02T03:04:05Z", "modules": []}`, false},
		{`{"modules": []}`, false},
	} {
		code, _, stderr := c.run(t, tc.want, "want", "ace", "--new", "-f", "-")
		if code != 0 || strings.Contains(stderr, `note: stdin: "at" 2036-01-01T00:00:00Z is `) != tc.note ||
			tc.note && !strings.Contains(stderr, "ahead of this machine's clock") {
			t.Errorf("%s: exit %d, stderr %q, want a note: %v", tc.want, code, stderr, tc.note)
		}
	}
}
