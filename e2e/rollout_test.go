package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/console"
	"github.com/meshfold/meshfold/query"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/examples"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/node/process"
	"github.com/meshfold/meshfold/provision"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/rollout/fleetfile"
	"github.com/meshfold/meshfold/store"
)

// rolloutDeadline bounds a whole rollout of these tests.
const rolloutDeadline = 60 * time.Second

// badBuild is the build a crashLooping runtime reports failed, restarted
// three times: a crash loop (rollout.CrashLoopRestarts).
const badBuild = "web:bad"

// crashLooping reports every module at badBuild failed with three
// restarts: the build crash-loops.
type crashLooping struct{ node.Runtime }

func (c crashLooping) Running(ctx context.Context) ([]events.HaveModule, error) {
	mods, err := c.Runtime.Running(ctx)
	for i := range mods {
		if mods[i].Build == badBuild {
			mods[i].State, mods[i].Restarts, mods[i].Exit = events.Failed, 3, "status 1"
		}
	}
	return mods, err
}

// fleetNodes starts n node agents named n00.. with a crashLooping
// DirRuntime and gives each the want web at build b1, waiting until each
// settled it.
func fleetNodes(t *testing.T, m *mesh, n int) []*nodeT {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rolloutDeadline)
	defer cancel()
	var nodes []*nodeT
	for i := range n {
		nd := m.newNode(fmt.Sprintf("n%02d", i))
		nd.startAgent(crashLooping{nd.dirRuntime()})
		nodes = append(nodes, nd)
	}
	for _, nd := range nodes {
		seq := must(m.want(ctx, nd.name, events.WantModule{Name: "web", Build: "web:1"}))(t)
		plan, _ := must2(m.planOf(ctx, nd.name, seq))(t)
		if _, err := m.settled(ctx, nd.name, plan); err != nil {
			t.Fatalf("%s: %v", nd.name, err)
		}
	}
	return nodes
}

// fleetFile is a fleet of nodes running web at build, with the rollout
// block.
func fleetFile(t *testing.T, nodes []*nodeT, build, block string) *fleetfile.Fleet {
	t.Helper()
	var b strings.Builder
	b.WriteString("fleet: web\nnodes:\n")
	for _, n := range nodes {
		fmt.Fprintf(&b, "  %s: {}\n", n.name)
	}
	fmt.Fprintf(&b, "groups:\n  - name: all\n    select: {}\n    modules: [{name: web, build: %q}]\nrollout: %s\n", build, block)
	f, _, err := fleetfile.Parse([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// apply starts a rollout of f as `meshfold apply` does and returns its id.
func (m *mesh) apply(t *testing.T, f *fleetfile.Fleet) uint64 {
	t.Helper()
	ctx := m.ctx()
	stream := must(m.js.Stream(ctx, m.cfg.Name))(t)
	plan := must(feed.NewPlan(ctx, stream, m.cfg.Subjects(), f, "alice", "test"))(t)
	return must(plan.Apply(ctx, m.js, m.cfg.Subjects()))(t)
}

// waitRollout replays the fleet's rollout until it reaches a final
// phase, or phase when not empty, and returns the state.
func (m *mesh) waitRollout(t *testing.T, fleet string, id uint64, phase rollout.Phase) *rollout.State {
	t.Helper()
	// Polling a replay: no event says "the fold decided".
	seen := waitfor.Value(t, rolloutDeadline, fmt.Sprintf("rollout %d of %s to be %q", id, fleet, phase), func() (replayed, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		s, err := feed.Replay(ctx, m.js, m.cfg, nil, fleet)
		cancel()
		if err != nil && !errors.Is(err, feed.ErrNoRollout) {
			t.Fatal(err)
		}
		if err == nil && s.Rollout != nil && s.Rollout.ID == id {
			p := s.Rollout.Phase
			return replayed{s}, phase == "" && p.Final() || p == phase
		}
		return replayed{s}, false
	})
	return seen.s
}

// replayed is a rollout's replay as a timed-out wait quotes it: its view.
type replayed struct{ s *rollout.State }

func (r replayed) String() string {
	var v rollout.View
	if r.s != nil {
		v = r.s.View()
	}
	return fmt.Sprintf("%+v", v)
}

// rolloutEvents reads every event of fleet's rollout subjects from seq on.
func (m *mesh) rolloutEvents(t *testing.T, fleet string, from uint64) []rollout.Input {
	t.Helper()
	ctx := m.ctx()
	subj := m.cfg.Subjects()
	stream := must(m.js.Stream(ctx, m.cfg.Name))(t)
	last := must(store.StreamLastSeq(ctx, stream))(t)
	tail := must(store.Follow(ctx, m.js, store.TailConfig{Stream: m.cfg.Name, Subjects: subj, Filter: subj.Rollout(fleet, "*"), Start: from}))(t)
	defer tail.Stop()
	var out []rollout.Input
	for {
		select {
		case x := <-tail.C():
			if x.Err != nil {
				t.Fatal(x.Err)
			}
			_, k, _ := subj.ParseRollout(x.Msg.Subject())
			out = append(out, rollout.FromRolloutEvent(rollout.Kind(k), x.Msg.Data(), x.Meta.Sequence.Stream, x.Meta.Timestamp))
			if x.Meta.NumPending == 0 {
				return out
			}
		case <-ctx.Done():
			t.Fatalf("rollout events to #%d: %v", last, ctx.Err())
		}
	}
}

// wantIDs returns the message ids of every want of node from seq on.
func (m *mesh) wantIDs(t *testing.T, node string, from uint64) []string {
	t.Helper()
	ctx := m.ctx()
	var ids []string
	err := store.ReadNode(ctx, m.js, m.cfg.Name, m.cfg.Subjects(), node, from, 0, func(msg store.Msg) error {
		if msg.Event.Kind == events.KindWant {
			ids = append(ids, msg.MsgID)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// A good build rolls out over 12 node agents in batches of 4, never more
// than max_unavailable (2) targets changing at once; every node gets its
// new want exactly once.
func TestRolloutGoodBuildInBatches(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	nodes := fleetNodes(t, m, 12)
	f := fleetFile(t, nodes, "web:2", "{batch: 4, max_unavailable: 2, min_healthy: 1s, healthy_deadline: 30s}")
	began := time.Now()
	id := m.apply(t, f)
	s := m.waitRollout(t, "web", id, "")
	took := time.Since(began)
	v := s.View()
	if s.Rollout.Phase != rollout.Completed || v.Counts[rollout.Done] != 12 {
		t.Fatalf("phase %s, counts %v", s.Rollout.Phase, v.Counts)
	}
	// The budget, read back from the records: a published forward want
	// changes its target until the target's done record.
	changing, most := map[string]bool{}, 0
	for _, in := range m.rolloutEvents(t, "web", id) {
		switch p := in.Payload.(type) {
		case *rollout.Published:
			changing[p.Node] = true
		case *rollout.Record:
			if p.What == string(rollout.Done) {
				delete(changing, p.Node)
			}
		}
		most = max(most, len(changing))
	}
	if most > 2 || most == 0 {
		t.Errorf("at most %d targets changing at once; max_unavailable is 2", most)
	}
	for _, n := range nodes {
		ids := m.wantIDs(t, n.name, id)
		if len(ids) != 1 || ids[0] != rollout.WantID("web", id, n.name, rollout.StepForward) {
			t.Errorf("%s: wants since the start %v", n.name, ids)
		}
	}
	t.Logf("12 nodes, batch 4, max_unavailable 2, min_healthy 1s: completed in %s", took.Round(time.Millisecond))
}

// A revert keeps the rollout's max_unavailable (a fresh user's finding
// L1: every changed target was given its previous want back at once): a
// good build completes on 12 node agents, then `rollout revert` gives
// each its previous want back, never more than 4 reverting at once (a
// revert's published want until its revert-reverted record, which waits
// for the previous want to settle and run), and each node gets its new
// want and its previous one back exactly once.
func TestRolloutRevertKeepsBudget(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	nodes := fleetNodes(t, m, 12)
	f := fleetFile(t, nodes, "web:2", "{batch: 12, max_unavailable: 4, min_healthy: 0s, healthy_deadline: 30s}")
	id := m.apply(t, f)
	if s := m.waitRollout(t, "web", id, ""); s.Rollout.Phase != rollout.Completed {
		t.Fatalf("phase %s: %+v", s.Rollout.Phase, s.View())
	}
	began := time.Now()
	if _, err := feed.Publish(m.ctx(), m.js, m.cfg.Subjects(), "web", rollout.KindRevert, rollout.NewOperator(rollout.KindRevert, id, "alice", "test"), ""); err != nil {
		t.Fatal(err)
	}
	s := m.waitRollout(t, "web", id, rollout.Reverted)
	took := time.Since(began)
	if v := s.View(); v.Counts[rollout.Done] != 12 {
		t.Fatalf("counts %v", v.Counts)
	}
	reverting, most, reverted := map[string]bool{}, 0, 0
	for _, in := range m.rolloutEvents(t, "web", id) {
		switch p := in.Payload.(type) {
		case *rollout.Published:
			if p.Step == rollout.StepRevert {
				reverting[p.Node] = true
			}
		case *rollout.Record:
			if p.What == "revert-"+string(rollout.RevertDone) {
				delete(reverting, p.Node)
				reverted++
			}
		}
		most = max(most, len(reverting))
	}
	if most > 4 || most == 0 || reverted != 12 {
		t.Errorf("at most %d targets reverting at once, %d reverted; max_unavailable is 4", most, reverted)
	}
	for _, n := range nodes {
		ids := m.wantIDs(t, n.name, id)
		if want := []string{rollout.WantID("web", id, n.name, rollout.StepForward), rollout.WantID("web", id, n.name, rollout.StepRevert)}; !slices.Equal(ids, want) {
			t.Errorf("%s: wants since the start %v, want %v", n.name, ids, want)
		}
	}
	t.Logf("12 nodes, max_unavailable 4: reverted in %s, at most %d reverting at once", took.Round(time.Millisecond), most)
}

// A crash-looping build is halted at the canary and reverted: only the
// canary ever gets it, and it gets its previous want back.
func TestRolloutCrashLoopHaltedAtCanaryAndReverted(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	nodes := fleetNodes(t, m, 12)
	f := fleetFile(t, nodes, badBuild, "{canary: 1, batch: 4, max_unavailable: 2, min_healthy: 1s, healthy_deadline: 30s, auto_revert: true}")
	id := m.apply(t, f)
	s := m.waitRollout(t, "web", id, "")
	if s.Rollout.Phase != rollout.Reverted {
		t.Fatalf("phase %s: %+v", s.Rollout.Phase, s.View())
	}
	canary := s.Rollout.Targets[0]
	for _, n := range nodes {
		ids := m.wantIDs(t, n.name, id)
		var want []string
		if n.name == canary {
			want = []string{rollout.WantID("web", id, n.name, rollout.StepForward), rollout.WantID("web", id, n.name, rollout.StepRevert)}
		}
		if strings.Join(ids, " ") != strings.Join(want, " ") {
			t.Errorf("%s: wants since the start %v, want %v", n.name, ids, want)
		}
	}
	// The canary runs its previous build again.
	ctx := m.ctx()
	last := must(store.LastMsg(ctx, must(m.js.Stream(ctx, m.cfg.Name))(t), m.cfg.Subjects(), canary, events.KindWant))(t)
	if w := last.Event.Payload.(*events.Want); len(w.Modules) != 1 || w.Modules[0].Build != "web:1" {
		t.Errorf("canary's newest want %+v", w.Modules)
	}
}

// The rollouts pages in a real browser: linked from the fleet page; a
// canary waiting for its promote is shown live (the page fetches itself
// again while the rollout moves), then the batches once promoted, and the
// completed rollout in the list.
func TestRolloutConsoleInBrowser(t *testing.T) {
	t.Parallel()
	exe := chromium(t)
	m := newMesh(t)
	nodes := fleetNodes(t, m, 4)
	nc, err := m.srv.Connect(nats.Name("console"))
	if err != nil {
		t.Fatal(err)
	}
	r := must(query.New(nc, query.Config{Stream: m.cfg}))(t)
	c := must(console.New(console.Config{Source: r, Logger: m.logger("console")}))(t)
	cctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	hs := httptest.NewServer(c) // loopback
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("console: %v", err)
		}
		nc.Close()
	})

	f := fleetFile(t, nodes, "web:2", "{canary: 1, batch: 2, max_unavailable: 2, min_healthy: 0s, healthy_deadline: 30s}")
	id := m.apply(t, f)
	m.waitRollout(t, "web", id, rollout.WaitingPromote)

	b := browser(t, exe)
	step(t, b, "open the fleet page", chromedp.Navigate(hs.URL+"/"))
	href := step(t, b, "its rollouts link", chromedp.Evaluate[string](`document.querySelector("#rollouts-link").href`))
	step(t, b, "follow it", chromedp.Navigate(href))
	step(t, b, "the list names fleet web", chromedp.Poll[chromedp.Void](
		`document.querySelector('#rollout-web .phase') !== null && document.querySelector('#rollout-web .phase').textContent === 'waiting-promote'`,
		chromedp.WithPollingTimeout(deadline)))
	href = step(t, b, "the rollout's link", chromedp.Evaluate[string](`document.querySelector("#rollout-web a").href`))
	step(t, b, "open it", chromedp.Navigate(href))
	step(t, b, "the canary is done, the others pending", chromedp.Poll[chromedp.Void](
		`document.querySelectorAll('tr.target[data-status="done"]').length === 1 && document.querySelectorAll('tr.target[data-status="pending"]').length === 3`,
		chromedp.WithPollingTimeout(deadline)))
	// The counts at the top, most pressing first, each a link to those
	// targets only (a fresh user's finding M7: 300 rows, no count).
	if got := step(t, b, "the counts", chromedp.Evaluate[string](`document.querySelector('#counts').textContent`)); got != "4 targets: 3 pending, 1 done" {
		t.Errorf("counts %q, want \"4 targets: 3 pending, 1 done\"", got)
	}
	href = step(t, b, "the done count's link", chromedp.Evaluate[string](`document.querySelector('#counts a.count[data-status="done"]').href`))
	step(t, b, "follow it", chromedp.Navigate(href))
	step(t, b, "the done canary alone", chromedp.Poll[chromedp.Void](
		`document.querySelectorAll('tr.target').length === 1 && document.querySelectorAll('tr.target[data-status="done"]').length === 1`,
		chromedp.WithPollingTimeout(deadline)))
	href = step(t, b, "every target's link", chromedp.Evaluate[string](`document.querySelector('#counts a[href="?"]').href`))
	step(t, b, "follow it", chromedp.Navigate(href))
	step(t, b, "every target again", chromedp.Poll[chromedp.Void](`document.querySelectorAll('tr.target').length === 4`, chromedp.WithPollingTimeout(deadline)))
	// Promote: the open page follows, without a click, to completed.
	if _, err := feed.Publish(m.ctx(), m.js, m.cfg.Subjects(), "web", rollout.KindPromote, rollout.NewOperator(rollout.KindPromote, id, "alice", ""), ""); err != nil {
		t.Fatal(err)
	}
	step(t, b, "the live page: every target done", chromedp.Poll[chromedp.Void](
		`document.querySelectorAll('tr.target[data-status="done"]').length === 4 && document.querySelector('#summary .phase').textContent === 'completed'`,
		chromedp.WithPollingTimeout(rolloutDeadline)))
	if n := step(t, b, "three batches", chromedp.Evaluate[int](`document.querySelectorAll('table.batch').length`)); n != 3 {
		t.Errorf("%d batches shown, want 3", n)
	}
	screenshot(t, b, "console-rollout.png")
}

// An agent stopped during a rollout: its agent event says down, its
// target holds no batch back and ends unreached when its deadline
// passes; restarted, the agent takes its newest want.
func TestRolloutAgentDownUnreached(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	nodes := fleetNodes(t, m, 4)
	dan := nodes[3]
	f := fleetFile(t, nodes, "web:2", "{batch: 4, max_unavailable: 4, min_healthy: 0s, healthy_deadline: 15s}")
	dan.agent.stop(t) // releases its lease: the reconciler records it down
	ctx := m.ctx()
	must(m.waitEvent(ctx, dan.name, events.KindAgent, func(ev events.Event) bool {
		a, ok := ev.Payload.(*events.Agent)
		return ok && a.State == events.AgentDown
	}))(t)
	id := m.apply(t, f)
	s := m.waitRollout(t, "web", id, "")
	v := s.View()
	if s.Rollout.Phase != rollout.Completed || v.Counts[rollout.Done] != 3 || v.Counts[rollout.Unreached] != 1 {
		t.Fatalf("phase %s, counts %v", s.Rollout.Phase, v.Counts)
	}
	if n := s.Rollout.Nodes[dan.name]; n.Status != rollout.Unreached {
		t.Fatalf("dan: %s", n.Status)
	}
	dan.startAgent(crashLooping{dan.dirRuntime()})
	must(m.waitEvent(m.ctx(), dan.name, events.KindHave, func(ev events.Event) bool {
		h, ok := ev.Payload.(*events.Have)
		return ok && len(h.Modules) == 1 && h.Modules[0].Build == "web:2"
	}))(t)
}

// A crash-looping build on real processes: three agents run web as a
// process (examples/idle), then a rollout gives them examples/
// mesh-build-go, which exits 1 without its credential. The canary's real
// module crash-loops, the rollout halts at it and reverts it, and the
// canary's process runs the previous build again; the other two never
// get the broken build.
func TestRolloutRealProcessesCrashLoopReverted(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*rolloutDeadline)
	defer cancel()
	acct := moduleAccount(t)
	idle := m.pushExample(examples.WriteIdle)
	bad := m.pushExample(examples.WriteMeshBuildGo)
	rts := map[string]*process.Runtime{}
	var nodes []*nodeT
	for i := range 3 {
		nd := m.newNode(fmt.Sprintf("p%d", i))
		rts[nd.name], _ = nd.processRuntime(process.Backoff{})
		nd.startAgent(rts[nd.name])
		nodes = append(nodes, nd)
	}
	for _, nd := range nodes {
		seq := must(m.want(ctx, nd.name, events.WantModule{Name: "web", Build: idle, RunsAs: acct}))(t)
		plan, _ := must2(m.planOf(ctx, nd.name, seq))(t)
		if s := must(m.settled(ctx, nd.name, plan))(t); s.Op == events.OpFailed {
			t.Fatalf("%s: %s", nd.name, s.Error)
		}
	}
	f, _, err := fleetfile.Parse(fmt.Appendf(nil, `fleet: web
nodes: {p0: {}, p1: {}, p2: {}}
groups: [{name: all, select: {}, modules: [{name: web, build: %q, runs_as: %s}]}]
rollout: {canary: 1, batch: 2, max_unavailable: 1, min_healthy: 2s, healthy_deadline: 1m, auto_revert: true}
`, bad, acct))
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	id := m.apply(t, f)
	s := m.waitRollout(t, "web", id, "")
	took := time.Since(began)
	if s.Rollout.Phase != rollout.Reverted || s.Rollout.Halt == nil || !strings.Contains(s.Rollout.Halt.Reason, "crash-loops") {
		t.Fatalf("phase %s, halt %+v: %+v", s.Rollout.Phase, s.Rollout.Halt, s.View())
	}
	canary := s.Rollout.Targets[0]
	st := must(waitStatus(ctx, rts[canary], "web", func(st process.Status) bool {
		return st.Build == idle && st.State == events.Running
	}))(t)
	for _, nd := range nodes {
		ids := m.wantIDs(t, nd.name, id)
		var want []string
		if nd.name == canary {
			want = []string{rollout.WantID("web", id, nd.name, rollout.StepForward), rollout.WantID("web", id, nd.name, rollout.StepRevert)}
		}
		if strings.Join(ids, " ") != strings.Join(want, " ") {
			t.Errorf("%s: wants since the start %v, want %v", nd.name, ids, want)
		}
	}
	t.Logf("real processes: the canary's mesh-build-go crash-looped, halted and reverted %s after apply; its process (pid %d) runs idle again",
		took.Round(100*time.Millisecond), st.PID)
}

// A rollout that adds a module with a declared file completes when the
// credential takes longer to come than the module's crash loop (a fresh
// user's finding G4): the provisioner's exec helper takes 8 s, well
// within its 10 s timeout, while mesh-build-go restarts 3 times in ~7 s
// (backoff 1 s, 2 s, 4 s) on the missing file. The module waits for its
// file: the rollout completes once it runs, and the target's why said
// which file it waited for. Before the fix the rollout halted on "3
// restarts" and auto_revert reverted it.
func TestRolloutSlowFill(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*rolloutDeadline)
	defer cancel()
	acct := moduleAccount(t)
	idle := m.pushExample(examples.WriteIdle)
	mbgBuild := m.pushExample(examples.WriteMeshBuildGo)
	nd := m.newNode("p0")
	rt, _ := nd.processRuntime(process.Backoff{})
	nd.startAgent(rt)
	prov := events.WantModule{Name: "provisioner", Build: idle, RunsAs: acct, Provisioner: true}
	seq := must(m.want(ctx, nd.name, prov))(t)
	plan, _ := must2(m.planOf(ctx, nd.name, seq))(t)
	if s := must(m.settled(ctx, nd.name, plan))(t); s.Op == events.OpFailed {
		t.Fatalf("%s: %s", nd.name, s.Error)
	}
	helper := filepath.Join(t.TempDir(), "slow.sh")
	if err := os.WriteFile(helper, []byte("#!/bin/sh\nsleep 8\nprintf '%s' '"+secret+"'\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	nd.provisioner = m.spawn(nd.name+"-provisioner", func(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) error {
		c, err := provision.New(nc, js, provision.Config{Node: nd.name, Account: acct,
			Sources: []provision.Source{&provision.Exec{Command: helper, Timeout: 10 * time.Second}},
			Stream:  m.cfg, Logger: m.logger("provision"), Timeout: 2 * time.Second, Trust: m.trust, Tracing: m.tp})
		if err != nil {
			return err
		}
		return c.Run(ctx)
	})
	f, _, err := fleetfile.Parse(fmt.Appendf(nil, `fleet: web
nodes: {p0: {}}
groups: [{name: all, select: {}, modules: [
  {name: provisioner, build: %q, runs_as: %s, provisioner: true},
  {name: %s, build: %q, runs_as: %s, files: [{path: %s, mode: "0600"}]}]}]
rollout: {min_healthy: 2s, healthy_deadline: 1m, auto_revert: true}
`, idle, acct, mbg, mbgBuild, acct, creds))
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	id := m.apply(t, f)
	// While the helper sleeps, the module crash-loops and the target's
	// why names the file it waits for.
	seen := waitfor.Value(t, rolloutDeadline, "the target's why to name its unfilled file", func() (replayed, bool) {
		rctx, rcancel := context.WithTimeout(ctx, deadline)
		s, err := feed.Replay(rctx, m.js, m.cfg, nil, "web")
		rcancel()
		if err != nil {
			t.Fatal(err)
		}
		if s.Rollout.Phase.Final() {
			return replayed{s}, true
		}
		lines, _ := s.Why(nd.name)
		return replayed{s}, strings.Contains(strings.Join(lines, "\n"), "waits for its unfilled file "+creds)
	})
	if seen.s.Rollout.Phase.Final() {
		t.Fatalf("the rollout ended before its target waited for its file: %s (halt %+v)", seen.s.Rollout.Phase, seen.s.Rollout.Halt)
	}
	s := m.waitRollout(t, "web", id, "")
	took := time.Since(began)
	if s.Rollout.Phase != rollout.Completed {
		t.Fatalf("phase %s, halt %+v: %+v", s.Rollout.Phase, s.Rollout.Halt, s.View())
	}
	st, _ := rt.Status(mbg)
	if st.State != events.Running {
		t.Fatalf("%s: %+v, want running", mbg, st)
	}
	t.Logf("slow fill (8 s helper): the rollout completed %s after apply; %s runs (restarts %d)", took.Round(100*time.Millisecond), mbg, st.Restarts)
}
