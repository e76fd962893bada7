package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/examples"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/node/bundle"
	"github.com/meshfold/meshfold/node/process"
)

// These tests run incident 1 with real processes (DESIGN.md §8): bundles
// pushed to the object store, the node agent with the process runtime
// (its shims are this test binary, re-executed: see TestMain), the
// examples/mesh-build-go script as the crash-looping module.

// moduleAccount is the Unix account modules and the provisioner run as:
// nobody when the tests run as root (CI), so the module runs as another
// user; else the current user (an agent that is not root runs every
// module as itself, but runs_as must still name a user).
func moduleAccount(t testing.TB) string {
	t.Helper()
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("nobody"); err != nil {
			t.Skip("running as root with no user nobody")
		}
		return "nobody"
	}
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	return u.Username
}

// pushExample packs and pushes an examples bundle, returning its build.
func (m *mesh) pushExample(write func(string) (string, error)) string {
	m.t.Helper()
	dir, err := write(m.t.TempDir())
	if err != nil {
		m.t.Fatal(err)
	}
	var b bytes.Buffer
	p, err := bundle.Pack(dir, &b)
	if err != nil {
		m.t.Fatal(err)
	}
	if _, _, err := bundle.NewStore(m.js, m.cfg.Name).Push(m.ctx(), p.Build, filepath.Base(dir), &b); err != nil {
		m.t.Fatal(err)
	}
	return p.Build
}

// openUp makes the node's directories reachable by the module's account:
// its temp dir and parents (made 0700 by the testing package) searchable,
// and the state directory traversable (the bundles are under it).
func (n *nodeT) openUp() {
	t := n.m.t
	// root is <TempDir>/<node>/root, TempDir <tmp>/<Test…>/<nnn>.
	for d := filepath.Dir(n.root); d != filepath.Dir(filepath.Dir(filepath.Dir(filepath.Dir(n.root)))); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(n.state, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(n.state, 0o711); err != nil {
		t.Fatal(err)
	}
}

// processRuntime opens the process runtime of the node, fetching bundles
// from the object store through a cache in its state directory. Cleanup
// stops every module (the shims outlive the agent otherwise).
func (n *nodeT) processRuntime(b process.Backoff) (*process.Runtime, *bundle.Cache) {
	t := n.m.t
	n.openUp()
	cache, err := bundle.NewCache(filepath.Join(n.state, "bundles"), bundle.NewStore(n.m.js, n.m.cfg.Name))
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	rt, err := process.Open(process.Config{Node: n.name, Root: n.root, StateDir: n.state, Fetcher: cache,
		Shim: []string{exe}, ShimEnv: []string{shimEnv + "=1"}, Backoff: b, Logger: n.m.logger("process")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		rt.StopAll(ctx)
		_ = rt.Close()
	})
	return rt, cache
}

// waitStatus waits until the runtime reports module in a status pred
// accepts. The runtime's status is what its shim last reported; it is
// read every few milliseconds (the test measures with the status's own
// Since, never with the poll). It keeps its own 2 ms tick rather than
// internal/waitfor's backoff: BenchmarkFillToRunning's time per op
// includes this wait.
func waitStatus(ctx context.Context, rt *process.Runtime, module string, pred func(process.Status) bool) (process.Status, error) {
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		if st, ok := rt.Status(module); ok && pred(st) {
			return st, nil
		}
		select {
		case <-ctx.Done():
			st, _ := rt.Status(module)
			return st, fmt.Errorf("waiting for %s's status (last %+v): %w", module, st, ctx.Err())
		case <-tick.C:
		}
	}
}

// haveOf waits for a have of node in which module's state is state, and
// returns that module.
func (m *mesh) haveOf(ctx context.Context, node, module string, state events.RunState, after uint64) (events.HaveModule, uint64, error) {
	ev, err := m.waitEvent(ctx, node, events.KindHave, func(ev events.Event) bool {
		if ev.Seq <= after {
			return false
		}
		for _, hm := range ev.Payload.(*events.Have).Modules {
			if hm.Name == module && hm.State == state {
				return true
			}
		}
		return false
	})
	if err != nil {
		return events.HaveModule{}, 0, err
	}
	for _, hm := range ev.Payload.(*events.Have).Modules {
		if hm.Name == module {
			return hm, ev.Seq, nil
		}
	}
	return events.HaveModule{}, 0, nil
}

// fillWhenServed sends a fill request once the node agent serves them
// (it starts to after its first apply, which its settle may precede).
func (m *mesh) fillWhenServed(ctx context.Context, node, module, path, writer, content string) (events.FillReply, error) {
	for {
		r, err := m.fill(ctx, node, module, path, writer, content)
		if !errors.Is(err, nats.ErrNoResponders) {
			return r, err
		}
		select {
		case <-ctx.Done():
			return r, fmt.Errorf("the node agent never served fill requests: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// uidOf reads the real uid of a process from /proc.
func uidOf(pid int) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(data), "\n") {
		if f, ok := strings.CutPrefix(l, "Uid:"); ok {
			return strconv.Atoi(strings.Fields(f)[0])
		}
	}
	return 0, fmt.Errorf("no Uid line in /proc/%d/status", pid)
}

// realIncident is incident 1 set up with real processes, up to the
// moment the module crash-loops on its missing credential after the
// knock: the provisioner's early write was refused, the want declaring
// it settled, the reconciler knocked.
type realIncident struct {
	n              *nodeT
	rt             *process.Runtime
	cache          *bundle.Cache
	acct           string
	prov, mbg      events.WantModule
	p1, p2         uint64
	knock, failedH uint64
}

func startRealIncident(t *testing.T, m *mesh) *realIncident {
	ctx := m.ctx()
	r := &realIncident{acct: moduleAccount(t)}
	idle := m.pushExample(examples.WriteIdle)
	mbgBuild := m.pushExample(examples.WriteMeshBuildGo)
	r.prov = events.WantModule{Name: "provisioner", Build: idle, RunsAs: r.acct, Provisioner: true}
	r.mbg = events.WantModule{Name: mbg, Build: mbgBuild, RunsAs: r.acct, Files: []events.File{{Path: creds, Mode: "0600"}}}

	r.n = m.newNode("ace")
	r.n.source(mbg, creds, secret)
	r.rt, r.cache = r.n.processRuntime(process.Backoff{})
	r.n.startAgent(r.rt)

	w1 := must(m.want(ctx, "ace", r.prov))(t)
	r.p1, _ = must2(m.planOf(ctx, "ace", w1))(t)
	must(m.settled(ctx, "ace", r.p1))(t)

	// The provisioner runs ahead: mesh-build-go's credential, before any
	// declaration names it, is refused as undeclared.
	reply := must(m.fillWhenServed(ctx, "ace", mbg, creds, r.acct, secret))(t)
	if reply.OK || reply.Reason != events.ReasonUndeclared {
		t.Fatalf("early fill: %+v, want refused undeclared", reply)
	}

	// The declaration: the node starts mesh-build-go (Apply returns once
	// its process started), settles, and the reconciler knocks.
	w2 := must(m.want(ctx, "ace", r.prov, r.mbg))(t)
	r.p2, _ = must2(m.planOf(ctx, "ace", w2))(t)
	s := must(m.settled(ctx, "ace", r.p2))(t)
	if s.Op == events.OpFailed {
		t.Fatalf("the apply failed: %s", s.Error)
	}
	k := must(m.waitEvent(ctx, "ace", events.KindKnock, func(events.Event) bool { return true }))(t)
	r.knock = k.Seq
	// The module finds no credential: it exits 1 and waits out its backoff.
	hm, seq := must2(m.haveOf(ctx, "ace", mbg, events.Failed, 0))(t)
	if hm.Exit != "status 1" {
		t.Errorf("failed have: %+v, want exit status 1", hm)
	}
	r.failedH = seq
	return r
}

// fillAndWaitRunning runs one provisioner pass (what the knocked client
// does) and waits until the module runs again; it returns the time from
// the start of the pass to the module's running state (by the shim's
// clock, the status's Since).
func (r *realIncident) fillAndWaitRunning(t testing.TB, ctx context.Context) (time.Duration, process.Status) {
	t.Helper()
	start := time.Now()
	rep := must(r.n.fillOnce(ctx, r.acct))(t)
	if len(rep.Refused) != 0 {
		t.Fatalf("fill pass: %+v", rep)
	}
	st := must(waitStatus(ctx, r.rt, mbg, func(st process.Status) bool {
		return st.State == events.Running && st.Since.After(start)
	}))(t)
	return st.Since.Sub(start), st
}

// Incident 1 end to end with a real crash loop: refused write, the want
// settles, knock, fill; the module's next start finds the file and stays
// running, the have goes failed → running, the module runs as its
// account, and its log holds its own "missing broker credential" line.
func TestIncident1RealProcess(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	r := startRealIncident(t, m)
	ctx := m.ctx() // after the setup, which has its own: this one bounds what follows

	d, st := r.fillAndWaitRunning(t, ctx)
	t.Logf("fill → running: %s (restarts %d)", d.Round(time.Millisecond), st.Restarts)
	content, mode, err := r.n.file(creds)
	if err != nil || content != secret || mode != 0o600 {
		t.Fatalf("credential: mode %v, %v", mode, err)
	}
	hm, _ := must2(m.haveOf(ctx, "ace", mbg, events.Running, r.failedH))(t)
	if hm.Build != r.mbg.Build || hm.Account != r.acct {
		t.Errorf("running have: %+v", hm)
	}

	// The process that found the credential: the first one reported
	// running after the pass began may have started just before the write
	// and been restarted by the fill (on_fill restart).
	for q := (node.LogQuery{Tail: 50}); ; {
		page := must(r.rt.Logs(ctx, mbg, q))(t)
		if strings.Contains(strings.Join(page.Lines, "\n"), "broker credential found") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the module never logged finding its credential: %v", ctx.Err())
		}
		q = node.LogQuery{Cursor: page.Cursor, WaitMS: 1000}
	}
	st, _ = r.rt.Status(mbg)

	// The process runs as the module's account (another user under root).
	acct := must(user.Lookup(r.acct))(t)
	if uid := must(uidOf(st.PID))(t); strconv.Itoa(uid) != acct.Uid {
		t.Errorf("module pid %d runs as uid %d, want %s (%s)", st.PID, uid, acct.Uid, r.acct)
	}
	// Its own lines, from its log: the crash, then the credential found.
	page := must(r.rt.Logs(ctx, mbg, node.LogQuery{Tail: 50, WaitMS: 5000}))(t)
	logs := strings.Join(page.Lines, "\n")
	if !strings.Contains(logs, "missing broker credential") {
		t.Errorf("module log lacks its missing-credential line:\n%s", logs)
	}
	if strings.Contains(logs, secret) {
		t.Error("the module log holds the credential")
	}

	// Exactly one knock; nothing owed; the secret in no event.
	if owed := must(m.quiesce(ctx, "ace"))(t); owed != 0 {
		t.Errorf("%d items still owed", owed)
	}
	if knocks := must(m.events(ctx, "ace", events.KindKnock))(t); len(knocks) != 1 {
		t.Errorf("%d knocks, want 1", len(knocks))
	}
	m.assertNoLeak()

	// The module stays running: no exit after the fill.
	if st2, _ := r.rt.Status(mbg); st2.State != events.Running || st2.PID != st.PID {
		t.Errorf("after the fill the module did not stay up: %+v", st2)
	}
	if bs := must(r.cache.Builds())(t); !slices.Contains(bs, r.mbg.Build) || !slices.Contains(bs, r.prov.Build) {
		t.Errorf("cache holds %v", bs)
	}
}

// Bundles a node must refuse: another scheme, no bucket yet, a build not
// in the bucket, content that does not match its build. Each fails the
// apply with a settle op failed whose error says why, and nothing of a
// refused bundle is kept.
func TestBundleRefusals(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ctx := m.ctx()
	n := m.newNode("ace")
	rt, cache := n.processRuntime(process.Backoff{})
	n.startAgent(rt)
	acct := moduleAccount(t)

	fails := func(build, msg string) {
		t.Helper()
		w := must(m.want(ctx, "ace", events.WantModule{Name: "x", Build: build, RunsAs: acct}))(t)
		p, _ := must2(m.planOf(ctx, "ace", w))(t)
		ev := must(m.waitEvent(ctx, "ace", events.KindSettle, func(ev events.Event) bool { return ev.Payload.(*events.Settle).Plan == p }))(t)
		s := ev.Payload.(*events.Settle)
		if s.Op != events.OpFailed || !strings.Contains(s.Error, msg) {
			t.Errorf("build %s: settle %+v, want failed with %q", build, s, msg)
		}
	}
	good := bundle.BuildOf([]byte("never pushed"))
	fails("img:sha256:"+strings.Repeat("a", 64), "not a bundle build")
	fails(good, "bucket MESH_BUILDS does not exist")

	idle := m.pushExample(examples.WriteIdle)
	fails(good, "is not in bucket MESH_BUILDS")
	// Stored under a build its bytes do not hash to (around Push, which
	// refuses that).
	obs := must(m.js.ObjectStore(ctx, "MESH_BUILDS"))(t)
	forged := bundle.BuildOf([]byte("forged"))
	data := must(obs.GetBytes(ctx, idle))(t)
	must(obs.PutBytes(ctx, forged, data))(t)
	fails(forged, "does not match its build")
	if bs := must(cache.Builds())(t); slices.Contains(bs, forged) {
		t.Errorf("the forged bundle was kept: %v", bs)
	}
	// The node still applies a good bundle afterwards.
	w := must(m.want(ctx, "ace", events.WantModule{Name: "x", Build: idle, RunsAs: acct}))(t)
	p, _ := must2(m.planOf(ctx, "ace", w))(t)
	if s := must(m.settled(ctx, "ace", p))(t); s.Op == events.OpFailed {
		t.Fatalf("good bundle: %s", s.Error)
	}
}

// BenchmarkFillToRunning measures incident 1's end with real processes:
// from the start of a provisioner's fill pass to the crash-looping
// module's running state (the shim's clock), over b.N rounds; each round
// removes the module (its file goes with it), wants it again (it starts,
// finds no credential, exits 1 and waits out its backoff), then fills.
// It reports the p50 and p99 (run with -benchtime=50x for the figure of
// docs/architecture.md). A figure, never an assertion.
func BenchmarkFillToRunning(b *testing.B) {
	m := newMesh(b)
	acct := moduleAccount(b)
	idle := m.pushExample(examples.WriteIdle)
	mbgBuild := m.pushExample(examples.WriteMeshBuildGo)
	prov := events.WantModule{Name: "provisioner", Build: idle, RunsAs: acct, Provisioner: true}
	mod := events.WantModule{Name: mbg, Build: mbgBuild, RunsAs: acct, Files: []events.File{{Path: creds, Mode: "0600"}}}
	n := m.newNode("ace")
	n.source(mbg, creds, secret)
	rt, _ := n.processRuntime(process.Backoff{})
	n.startAgent(rt)
	r := &realIncident{n: n, rt: rt, acct: acct}

	var times []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		b.StopTimer()
		for _, mods := range [][]events.WantModule{{prov}, {prov, mod}} {
			w := must(m.want(ctx, "ace", mods...))(b)
			p, _ := must2(m.planOf(ctx, "ace", w))(b)
			must(m.settled(ctx, "ace", p))(b)
		}
		// Removal deleted the file: the new start fails.
		must(waitStatus(ctx, rt, mbg, func(st process.Status) bool {
			return st.State == events.Failed && st.Exit == "status 1"
		}))(b)
		b.StartTimer()
		d, _ := r.fillAndWaitRunning(b, ctx)
		times = append(times, d)
		cancel()
	}
	b.StopTimer()
	slices.Sort(times)
	pct := func(p float64) time.Duration { return times[min(len(times)-1, int(p*float64(len(times))))] }
	b.ReportMetric(float64(pct(0.50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(pct(0.99).Microseconds())/1000, "p99-ms")
	b.Logf("fill → running over %d rounds: p50 %s, p99 %s, max %s", len(times), pct(0.50), pct(0.99), times[len(times)-1])
}
