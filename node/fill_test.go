package node

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
)

func mkdir(dir string) error { return os.MkdirAll(dir, 0o755) }

const (
	creds = "/run/mesh-build-go/broker.creds"
	mbg   = "mesh-build-go"
)

// An accepted write lands under the root with its content and declared
// mode, atomically (no temporary file left), and is reported as filled
// with the keyed digest, never a plain hash.
func TestFillAcceptedWritesContentAndMode(t *testing.T) {
	e := newEnv(t)
	seq := e.publishPlan(t, "ace", "prov",
		events.PlanModule{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: creds, Mode: "0640"}}})
	a := e.startAgent(t, "ace", nil)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(seq))

	reply, _ := e.fill(t, "ace", mbg, creds, "prov", []byte(secret))
	if !reply.OK || reply.Reason != "" || reply.Error != "" {
		t.Fatalf("reply = %+v, want ok", reply)
	}
	target := filepath.Join(a.root, creds)
	got, err := os.ReadFile(target)
	if err != nil || string(got) != secret {
		t.Fatalf("file = %q, %v; want the content", got, err)
	}
	fi, _ := os.Stat(target)
	if fi.Mode().Perm() != 0o640 {
		t.Errorf("mode = %v, want 0640", fi.Mode().Perm())
	}
	ents, _ := os.ReadDir(filepath.Dir(target))
	if len(ents) != 1 {
		t.Errorf("directory holds %d entries, want only the file (no temporary left)", len(ents))
	}

	m := e.waitEvent(t, "ace", events.KindFilled, func(store.Msg) bool { return true })
	f := m.Event.Payload.(*events.Filled)
	key, err := os.ReadFile(filepath.Join(a.state, keyFile))
	if err != nil {
		t.Fatal(err)
	}
	plain := sha256.Sum256([]byte(secret))
	if f.Module != mbg || f.Path != creds || f.Plan != seq {
		t.Errorf("filled = %+v, want %s %s plan %d", f, mbg, creds, seq)
	}
	if f.Digest != digest(key, []byte(secret)) || f.Digest == hex.EncodeToString(plain[:]) {
		t.Errorf("digest %s is not the HMAC under the node's key", f.Digest)
	}
	if fi, _ := os.Stat(filepath.Join(a.state, keyFile)); fi.Mode().Perm() != 0o600 {
		t.Errorf("key mode = %v, want 0600", fi.Mode().Perm())
	}
	if fi, _ := os.Stat(a.state); fi.Mode().Perm() != 0o700 {
		t.Errorf("state dir mode = %v, want 0700", fi.Mode().Perm())
	}
	assertNoLeak(t, e.js, e.cfg.Name, a.logs.String())
	if testing.Verbose() {
		t.Log(a.logs.String())
	}
}

// The key is created once: a second agent on the same state directory
// uses it, so digests of the same content agree across restarts.
func TestKeyCreatedOnce(t *testing.T) {
	dir := t.TempDir()
	k1, err := loadKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := loadKey(dir)
	if err != nil || string(k1) != string(k2) || len(k1) != keySize {
		t.Fatalf("second load: %v, same=%v", err, string(k1) == string(k2))
	}
	if err := os.Chmod(filepath.Join(dir, keyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadKey(dir); err == nil {
		t.Fatal("a key readable by others was accepted")
	}
}

// Every refusal reason, judged by the settled plan, with a refusal event
// naming that plan and a deterministic message id; a repeat is dropped by
// JetStream as a duplicate.
func TestFillRefusals(t *testing.T) {
	e := newEnv(t)
	a := e.startAgent(t, "ace", nil)
	outside := t.TempDir()

	// No plan settled: plan 0, no account.
	r, _ := e.fill(t, "ace", mbg, creds, "prov", []byte(secret))
	checkRefusal(t, e, r, "ace", mbg, creds, "prov", events.ReasonNoAccount, 0)

	// A plan that names no provisioner account.
	p1 := e.publishPlan(t, "ace", "", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p1))
	r, _ = e.fill(t, "ace", mbg, creds, "prov", []byte(secret))
	checkRefusal(t, e, r, "ace", mbg, creds, "prov", events.ReasonNoAccount, p1)

	// A plan with account prov.
	files := []events.File{
		{Path: creds, Mode: "0600"},
		{Path: "/escape/inner/key", Mode: "0600"}, // /escape is a symlink out of the root
		{Path: "/run/link", Mode: "0600"},         // a symlink to a file out of the root: replaced
		{Path: ReservedDir + "/modules/x.json", Mode: "0600"},
	}
	p2 := e.publishPlan(t, "ace", "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg", Files: files})
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p2))

	r, _ = e.fill(t, "ace", mbg, creds, "intruder", []byte(secret))
	checkRefusal(t, e, r, "ace", mbg, creds, "intruder", events.ReasonWrongAccount, p2)
	r, _ = e.fill(t, "ace", mbg, "/run/mesh-build-go/other", "prov", []byte(secret))
	checkRefusal(t, e, r, "ace", mbg, "/run/mesh-build-go/other", "prov", events.ReasonUndeclared, p2)
	r, _ = e.fill(t, "ace", "postgres", creds, "prov", []byte(secret))
	checkRefusal(t, e, r, "ace", "postgres", creds, "prov", events.ReasonUndeclared, p2)

	// Escapes through symlinks, with no ".." anywhere in the request.
	if err := os.Symlink(outside, filepath.Join(a.root, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(a.root, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "victim"), []byte("untouched"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "victim"), filepath.Join(a.root, "run", "link")); err != nil {
		t.Fatal(err)
	}
	r, _ = e.fill(t, "ace", mbg, "/escape/inner/key", "prov", []byte(secret))
	checkRefusal(t, e, r, "ace", mbg, "/escape/inner/key", "prov", events.ReasonWriteFailed, p2)
	// A symlink at the file itself is replaced by the rename, never
	// followed: its target is left as it was.
	if r, _ = e.fill(t, "ace", mbg, "/run/link", "prov", []byte(secret)); !r.OK {
		t.Fatalf("fill over a symlink: %+v, want it replaced", r)
	}
	if fi, err := os.Lstat(filepath.Join(a.root, "run", "link")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("the symlink at the filled path was not replaced by a file: %v, %v", fi, err)
	}
	r, _ = e.fill(t, "ace", mbg, ReservedDir+"/modules/x.json", "prov", []byte(secret))
	checkRefusal(t, e, r, "ace", mbg, ReservedDir+"/modules/x.json", "prov", events.ReasonWriteFailed, p2)
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Errorf("outside the root: %d entries, want only the untouched victim", len(ents))
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "victim")); string(b) != "untouched" {
		t.Errorf("a file outside the root was overwritten")
	}
	if _, err := os.Stat(filepath.Join(a.root, ReservedDir, "modules", "x.json")); err == nil {
		t.Errorf("a fill wrote into the reserved directory")
	}

	// The same refusal again: same id, dropped as a duplicate.
	before := len(e.events(t, "ace", events.KindRefusal))
	r, _ = e.fill(t, "ace", mbg, "/run/mesh-build-go/other", "prov", []byte(secret))
	if r.Reason != events.ReasonUndeclared {
		t.Fatalf("repeat: %+v", r)
	}
	if after := len(e.events(t, "ace", events.KindRefusal)); after != before {
		t.Errorf("refusals in the stream: %d after the repeat, %d before; want the repeat dropped", after, before)
	}
	var dup int
	for _, s := range a.rec.all() {
		if _, ok := s.payload.(*events.Refusal); ok && s.ack.Duplicate {
			dup++
		}
	}
	if dup != 1 {
		t.Errorf("%d refusal appends acknowledged as duplicates, want 1", dup)
	}
	assertNoLeak(t, e.js, e.cfg.Name, a.logs.String())
	if testing.Verbose() {
		t.Log(a.logs.String())
	}
}

// checkRefusal checks the reply and the refusal event in the stream.
func checkRefusal(t *testing.T, e *env, r events.FillReply, node, module, path, writer string, reason events.Reason, plan uint64) {
	t.Helper()
	if r.OK || r.Reason != reason {
		t.Fatalf("%s %s by %s: reply %+v, want refused %s", module, path, writer, r, reason)
	}
	if reason == events.ReasonWriteFailed && r.Error == "" {
		t.Errorf("write-failed reply without an error")
	}
	if strings.Contains(r.Error, secret) {
		t.Errorf("reply error holds the content")
	}
	prefix := node + ".refusal." + strconv.FormatUint(plan, 10) + "."
	m := e.waitEvent(t, node, events.KindRefusal, func(m store.Msg) bool {
		got, ok := m.Event.Payload.(*events.Refusal)
		return ok && strings.HasPrefix(m.MsgID, prefix) && got.Module == module && got.Path == path &&
			got.Writer == writer && got.Reason == reason && got.Plan == plan
	})
	// <node>.refusal.<plan>.<16 hex>, and for a write failure a unique
	// suffix: each failed write is a new failure.
	rest := strings.TrimPrefix(m.MsgID, prefix)
	if reason == events.ReasonWriteFailed {
		var ok bool
		if rest, _, ok = strings.Cut(rest, "."); !ok {
			t.Errorf("write-failed refusal id %q has no unique suffix", m.MsgID)
		}
	}
	if len(rest) != 16 {
		t.Errorf("refusal id %q is not %s<16 hex>", m.MsgID, prefix)
	}
}

// RefusalID depends on the node's key, node, plan, module, path and writer
// only: another node, without the key, cannot predict it.
func TestRefusalIDDeterministic(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	RefusalID := func(node string, plan uint64, module, path, writer string) string {
		return RefusalID(key, node, plan, module, path, writer)
	}
	a := RefusalID("ace", 7, mbg, creds, "prov")
	if other := refusalIDWithKey([]byte("another key"), "ace", 7, mbg, creds, "prov"); other == a {
		t.Error("the id does not depend on the node's key")
	}
	if a != RefusalID("ace", 7, mbg, creds, "prov") {
		t.Fatal("not deterministic")
	}
	for _, b := range []string{
		RefusalID("ace", 8, mbg, creds, "prov"), RefusalID("bob", 7, mbg, creds, "prov"),
		RefusalID("ace", 7, "x", creds, "prov"), RefusalID("ace", 7, mbg, "/x", "prov"),
		RefusalID("ace", 7, mbg, creds, "other"),
		// The NUL separators keep (a, bc) and (ab, c) apart.
		RefusalID("ace", 7, "ab", "/c", "d"),
	} {
		if a == b {
			t.Errorf("%s collides", b)
		}
	}
	if RefusalID("ace", 7, "a", "/bc", "d") == RefusalID("ace", 7, "a/", "bc", "d") {
		t.Error("fields run together")
	}
	if !strings.HasPrefix(a, "ace.refusal.7.") || len(a) != len("ace.refusal.7.")+16 {
		t.Errorf("id %q", a)
	}
}

// A malformed request is answered with a micro service error naming the
// header, and publishes nothing.
func TestBadFillRequest(t *testing.T) {
	e := newEnv(t)
	a := e.startAgent(t, "ace", nil)
	r, msg := e.fill(t, "ace", mbg, "relative/path", "prov", []byte(secret))
	if r.OK || r.Reason != "" || !strings.Contains(r.Error, events.HeaderPath) {
		t.Fatalf("reply = %+v, want an error naming %s", r, events.HeaderPath)
	}
	if msg.Header.Get(micro.ErrorCodeHeader) != "400" {
		t.Errorf("service error code = %q, want 400", msg.Header.Get(micro.ErrorCodeHeader))
	}
	r, _ = e.fill(t, "ace", mbg, creds, "prov", nil)
	if r.Reason != events.ReasonNoAccount { // a good request after it still works
		t.Fatalf("reply = %+v", r)
	}
	for _, s := range a.rec.all() {
		if rf, ok := s.payload.(*events.Refusal); ok && rf.Path != creds {
			t.Errorf("a malformed request was reported: %+v", rf)
		}
	}
}

// Running as root, an accepted write is owned by the module's account
// when that account exists as a user; an unknown account leaves it to
// the agent's user.
func TestFillChownsToAccount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	e := newEnv(t)
	seq := e.publishPlan(t, "ace", "prov",
		events.PlanModule{Name: "alpha", Build: "a:1", RunsAs: "nobody", Files: []events.File{{Path: "/etc/alpha/key", Mode: "0400"}}},
		events.PlanModule{Name: "bravo", Build: "b:1", RunsAs: "no-such-user-here", Files: []events.File{{Path: "/etc/bravo/key", Mode: "0400"}}})
	a := e.startAgent(t, "ace", nil)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(seq))
	for _, f := range []struct{ module, path, uid string }{{"alpha", "/etc/alpha/key", u.Uid}, {"bravo", "/etc/bravo/key", "0"}} {
		if r, _ := e.fill(t, "ace", f.module, f.path, "prov", []byte(secret)); !r.OK {
			t.Fatalf("%s: %+v", f.path, r)
		}
		fi, err := os.Stat(filepath.Join(a.root, f.path))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if strconv.FormatUint(uint64(st.Uid), 10) != f.uid || fi.Mode().Perm() != 0o400 {
			t.Errorf("%s: uid %d mode %v, want uid %s mode 0400", f.path, st.Uid, fi.Mode().Perm(), f.uid)
		}
	}
}

var refusalIDWithKey = RefusalID

// A refill of the content a file already holds rewrites nothing and
// appends no filled; new content does, and so does the first accepted
// fill after this agent refused a write of that file (an item may be
// owed that only a filled pays).
func TestRefillUnchangedAppendsNothing(t *testing.T) {
	e := newEnv(t)
	seq := e.publishPlan(t, "ace", "prov",
		events.PlanModule{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: creds, Mode: "0600"}}})
	a := e.startAgent(t, "ace", nil)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(seq))
	filled := func() int { return len(e.events(t, "ace", events.KindFilled)) }

	if r, _ := e.fill(t, "ace", mbg, creds, "prov", []byte(secret)); !r.OK || r.Unchanged {
		t.Fatalf("first fill: %+v", r)
	}
	target := filepath.Join(a.root, creds)
	fi, err := os.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if r, _ := e.fill(t, "ace", mbg, creds, "prov", []byte(secret)); !r.OK || !r.Unchanged {
			t.Fatalf("refill of the same content: %+v, want ok and unchanged", r)
		}
	}
	if n := filled(); n != 1 {
		t.Fatalf("%d filled events after three unchanged refills, want 1", n)
	}
	if fi2, _ := os.Stat(target); !os.SameFile(fi, fi2) {
		t.Error("the unchanged refill replaced the file")
	}
	// A refused write of the file (a stale writer), then the same content
	// again: written and reported, since something may be owed.
	if r, _ := e.fill(t, "ace", mbg, creds, "stale", []byte(secret)); r.Reason != events.ReasonWrongAccount {
		t.Fatalf("stale writer: %+v", r)
	}
	if r, _ := e.fill(t, "ace", mbg, creds, "prov", []byte(secret)); !r.OK || r.Unchanged {
		t.Fatalf("fill after a refusal: %+v, want written", r)
	}
	if r, _ := e.fill(t, "ace", mbg, creds, "prov", []byte(secret)); !r.Unchanged {
		t.Fatalf("refill after that: %+v, want unchanged", r)
	}
	// New content is written.
	if r, _ := e.fill(t, "ace", mbg, creds, "prov", []byte(secret+"2")); !r.OK || r.Unchanged {
		t.Fatalf("new content: %+v", r)
	}
	// The file changed behind the agent's back (deleted): written again.
	if err := os.Remove(target); err != nil {
		t.Fatal(err)
	}
	if r, _ := e.fill(t, "ace", mbg, creds, "prov", []byte(secret+"2")); !r.OK || r.Unchanged {
		t.Fatalf("fill of a deleted file: %+v", r)
	}
	if n := filled(); n != 4 {
		t.Fatalf("%d filled events, want 4 (first, after the refusal, new content, deleted)", n)
	}
}

// A retry of the fill request that wrote a file (the same
// events.HeaderRequest, its reply lost to a timeout) finds the content in
// place and is answered as that write was, OK and not unchanged, with no
// second filled; another request, or none, finds it unchanged. A new
// write by another request makes the first one's retry unchanged.
func TestRetryOfWritingRequestIsNotUnchanged(t *testing.T) {
	e := newEnv(t)
	seq := e.publishPlan(t, "ace", "prov",
		events.PlanModule{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.startAgent(t, "ace", nil)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(seq))
	filled := func() int { return len(e.events(t, "ace", events.KindFilled)) }

	for i, step := range []struct {
		request, content string
		unchanged        bool
	}{
		{"r1", secret, false},       // the write
		{"r1", secret, false},       // its retry
		{"r1", secret, false},       // and another
		{"r2", secret, true},        // another request: the content was there before it
		{"", secret, true},          // a client that names no request
		{"r3", secret + "2", false}, // new content, written by r3
		{"r1", secret + "2", true},  // r1 did not write what is there now
	} {
		r, _ := e.fillRequest(t, "ace", mbg, creds, "prov", step.request, []byte(step.content))
		if !r.OK || r.Unchanged != step.unchanged {
			t.Fatalf("step %d (request %q): %+v, want ok and unchanged=%v", i, step.request, r, step.unchanged)
		}
	}
	if n := filled(); n != 2 {
		t.Fatalf("%d filled events, want 2 (r1's write, r3's)", n)
	}
}

// A push consumer over the node's own plans, delivering to its fill
// subject with the service's queue group (issue 24: a node may create
// one; the server checks no deliver subject), reaches the fill handler
// no more: the delivery is dropped at the door and logged, and a fill
// request after it is answered as before.
func TestFillDropsJetStreamDeliveries(t *testing.T) {
	e := newEnv(t)
	a := e.startAgent(t, "ace", nil)
	e.publishPlan(t, "ace", "mbg", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: creds, Mode: "0640"}}})
	if r, _ := e.fill(t, "ace", mbg, creds, "prov", nil); r.Error != "" {
		t.Fatalf("fill before: %+v", r) // the service is up
	}
	ctx := ctxT(t)
	subj := e.cfg.Subjects()
	cons, err := e.js.CreatePushConsumer(ctx, e.cfg.Name, jetstream.ConsumerConfig{FilterSubject: subj.Stored("ace", events.KindPlan),
		DeliverSubject: subj.Fill("ace"), DeliverGroup: micro.DefaultQueueGroup, AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, wait, "the push consumer to deliver", func() bool {
		info, err := e.js.PushConsumer(ctx, e.cfg.Name, cons.CachedInfo().Name)
		return err == nil && info.CachedInfo().Delivered.Consumer > 0
	})
	// The fill endpoint handles its messages in order: once this reply
	// is in, the delivery before it was handled.
	if r, _ := e.fill(t, "ace", mbg, creds, "prov", nil); r.Error != "" {
		t.Fatalf("fill after: %+v", r)
	}
	if !strings.Contains(a.logs.String(), "dropped a message that is no core request") {
		t.Fatalf("the delivery was not dropped at the door; the agent logged:\n%s", a.logs.String())
	}
	if strings.Contains(a.logs.String(), "bad fill request") {
		t.Errorf("the delivery reached the fill handler:\n%s", a.logs.String())
	}
}

// A plan that changes a declared file's mode, or its module's account,
// gives the file on the node that mode and owner at its settle, without a
// fill (a fresh user's finding U31: the module restarted as its new
// account and met "Permission denied" until a poke or the resync).
func TestPlanRefitsFileOwnerAndMode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	daemon, err := user.Lookup("daemon")
	if err != nil {
		t.Skip("no user daemon")
	}
	e := newEnv(t)
	row := func(runsAs, mode string) events.PlanModule {
		return events.PlanModule{Name: "app", Build: "a:1", RunsAs: runsAs, Files: []events.File{{Path: "/run/app/token", Mode: events.Mode(mode)}}}
	}
	seq := e.publishPlan(t, "ace", "prov", row("nobody", "0600"))
	a := e.startAgent(t, "ace", nil)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(seq))
	if r, _ := e.fill(t, "ace", "app", "/run/app/token", "prov", []byte(secret)); !r.OK {
		t.Fatalf("fill: %+v", r)
	}
	check := func(uid string, mode os.FileMode) {
		t.Helper()
		fi, err := os.Stat(filepath.Join(a.root, "run/app/token"))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if strconv.FormatUint(uint64(st.Uid), 10) != uid || fi.Mode().Perm() != mode {
			t.Errorf("token: uid %d mode %v, want uid %s mode %v", st.Uid, fi.Mode().Perm(), uid, mode)
		}
		if data, _ := os.ReadFile(filepath.Join(a.root, "run/app/token")); string(data) != secret {
			t.Error("the refit changed the content")
		}
	}
	check(nobody.Uid, 0o600)
	seq = e.publishPlan(t, "ace", "prov", row("nobody", "0640"))
	e.waitEvent(t, "ace", events.KindSettle, settleOf(seq))
	check(nobody.Uid, 0o640)
	seq = e.publishPlan(t, "ace", "prov", row("daemon", "0640"))
	e.waitEvent(t, "ace", events.KindSettle, settleOf(seq))
	check(daemon.Uid, 0o640)
}
