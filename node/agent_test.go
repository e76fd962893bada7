package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
)

// The agent switches the plan it judges by before it publishes the
// plan's settles: a write judged at the moment a settle is published is
// judged by the new plan. The recorder calls the fill path just before
// each settle is appended, so the check is deterministic.
func TestSettlesPublishedAfterSwitch(t *testing.T) {
	e := newEnv(t)
	a := e.startAgent(t, "ace", nil)
	e.waitEvent(t, "ace", events.KindHave, func(store.Msg) bool { return true })

	var mu sync.Mutex
	var judged []events.FillReply
	before := func(p events.Payload) {
		if s, ok := p.(*events.Settle); ok && s.Op == events.OpApply {
			r := a.fill(context.Background(), events.FillRequest{Module: mbg, Path: creds, Writer: "prov"}, []byte(secret))
			mu.Lock()
			judged = append(judged, r)
			mu.Unlock()
		}
	}
	a.rec.before.Store(&before)
	seq := e.publishPlan(t, "ace", "prov",
		events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.waitEvent(t, "ace", events.KindSettle, settleOf(seq))

	mu.Lock()
	defer mu.Unlock()
	if len(judged) != 1 || !judged[0].OK {
		t.Fatalf("writes judged as the settle was published: %+v; want one, accepted by the new plan", judged)
	}
	// And the filled names the new plan.
	m := e.waitEvent(t, "ace", events.KindFilled, func(store.Msg) bool { return true })
	if f := m.Event.Payload.(*events.Filled); f.Plan != seq {
		t.Errorf("filled names plan %d, want %d", f.Plan, seq)
	}
}

// settlesOf returns the settles of plan in stream order.
func settlesOf(t *testing.T, e *env, node string, plan uint64) []events.Settle {
	var out []events.Settle
	for _, m := range e.events(t, node, events.KindSettle) {
		if s := m.Event.Payload.(*events.Settle); s.Plan == plan {
			out = append(out, *s)
		}
	}
	return out
}

func brief(ss []events.Settle) string {
	var b []string
	for _, s := range ss {
		b = append(b, s.Module+":"+string(s.Op))
	}
	return strings.Join(b, " ")
}

// One settle per module the plan changed (applied or removed), in order;
// one with an empty module when it changed none; held rows are neither
// started nor removed.
func TestSettlesPerChangedModule(t *testing.T) {
	e := newEnv(t)
	a := e.startAgent(t, "ace", nil)
	// Serving fills means the agent read the (absent) newest plan and
	// follows from there: every plan below is applied, none skipped.
	e.fill(t, "ace", "alpha", "/etc/x", "prov", nil)
	rt := filepath.Join(a.root, ReservedDir, "modules")
	modA := events.PlanModule{Name: "alpha", Build: "a:1", RunsAs: "ua"}
	modB := events.PlanModule{Name: "bravo", Build: "b:1", RunsAs: "ub"}

	// Each plan once the previous one settled: a plan superseded before
	// the agent reaches it is skipped (TestSupersededPlansSkipped).
	step := func(rows ...events.PlanModule) uint64 {
		p := e.publishPlan(t, "ace", "", rows...)
		e.waitEvent(t, "ace", events.KindSettle, settleOf(p))
		return p
	}
	p1 := step(modA, modB)
	modA2 := modA
	modA2.Files = []events.File{{Path: "/etc/alpha/key", Mode: "0600"}}
	p2 := step(modA2, modB) // files only: no runtime change
	held := events.PlanModule{Name: "charlie", Held: true, Why: events.HoldApproval, Pending: "c:1"}
	p3 := step(modA2, held) // bravo removed; charlie held with nothing running
	heldA := events.PlanModule{Name: "alpha", Build: "a:1", RunsAs: "ua", Held: true, Why: events.HoldApproval, Pending: "a:2"}
	p4 := step(heldA, held) // alpha held at what runs
	modA3 := modA
	modA3.RunsAs = "ua2"
	p5 := step(modA3, held) // an account change is a change
	p6 := step(modA3, held) // nothing: closes p5's settles

	for _, c := range []struct {
		plan uint64
		want string
	}{
		{p1, "alpha:apply bravo:apply"},
		{p2, ":apply"},
		{p3, "bravo:remove"},
		{p4, ":apply"},
		{p5, "alpha:apply"},
		{p6, ":apply"},
	} {
		if got := brief(settlesOf(t, e, "ace", c.plan)); got != c.want {
			t.Errorf("plan %d settles: %q, want %q", c.plan, got, c.want)
		}
	}
	for _, f := range []string{"bravo.json", "charlie.json"} {
		if _, err := os.Stat(filepath.Join(rt, f)); err == nil {
			t.Errorf("%s recorded: a removed or held-with-nothing-running module runs", f)
		}
	}
	if a.Settled() != p6 {
		t.Errorf("settled = %d, want %d", a.Settled(), p6)
	}
	// The log says what the settles say: a settle of "no module
	// changed" is changed=0 (issue 25), two modules changed=2.
	logs := a.logs.String()
	for _, want := range []string{fmt.Sprintf("plan=%d changed=2", p1), fmt.Sprintf("plan=%d changed=0", p2), fmt.Sprintf("plan=%d changed=1", p3)} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log lacks %q:\n%s", want, logs)
		}
	}
}

// failingRuntime fails to apply any build named "broken".
type failingRuntime struct {
	*DirRuntime
	mu    sync.Mutex
	fails int // fail this many applies of "broken" builds; <0: always
}

func (f *failingRuntime) Apply(ctx context.Context, m events.PlanModule) error {
	f.mu.Lock()
	fail := strings.HasPrefix(m.Build, "broken") && f.fails != 0
	if fail && f.fails > 0 {
		f.fails--
	}
	f.mu.Unlock()
	if fail {
		return errors.New("boom: image not found")
	}
	return f.DirRuntime.Apply(ctx, m)
}

// A failed apply publishes op failed with the error, and the agent keeps
// judging writes by the previous plan.
func TestFailedApplyKeepsPreviousPlan(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	dr, err := NewDirRuntime(filepath.Join(dir, "modules"))
	if err != nil {
		t.Fatal(err)
	}
	a := e.startAgent(t, "ace", &failingRuntime{DirRuntime: dr, fails: -1})

	p1 := e.publishPlan(t, "ace", "prov", events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg",
		Files: []events.File{{Path: creds, Mode: "0600"}}})
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p1))
	p2 := e.publishPlan(t, "ace", "prov", events.PlanModule{Name: mbg, Build: "broken:2", RunsAs: "mbg",
		Files: []events.File{{Path: "/run/mesh-build-go/new.creds", Mode: "0600"}}})
	m := e.waitEvent(t, "ace", events.KindSettle, settleOf(p2))
	s := m.Event.Payload.(*events.Settle)
	if s.Op != events.OpFailed || s.Module != mbg || !strings.Contains(s.Error, "boom") {
		t.Fatalf("settle = %+v, want op failed for %s with the error", s, mbg)
	}
	if got := settlesOf(t, e, "ace", p2); len(got) != 1 {
		t.Errorf("plan %d: %d settles, want only the failure", p2, len(got))
	}
	if a.Settled() != p1 {
		t.Fatalf("settled = %d, want the previous plan %d", a.Settled(), p1)
	}
	// Judged by p1: its file is accepted, p2's is undeclared at plan p1.
	if r, _ := e.fill(t, "ace", mbg, creds, "prov", []byte(secret)); !r.OK {
		t.Errorf("p1's file: %+v, want accepted", r)
	}
	r, _ := e.fill(t, "ace", mbg, "/run/mesh-build-go/new.creds", "prov", []byte(secret))
	checkRefusal(t, e, r, "ace", mbg, "/run/mesh-build-go/new.creds", "prov", events.ReasonUndeclared, p1)
	if dr2, _ := dr.Running(context.Background()); len(dr2) != 1 || dr2[0].Build != "g:1" {
		t.Errorf("runs %+v, want g:1 still", dr2)
	}
	assertNoLeak(t, e.js, e.cfg.Name, a.logs.String())
}

// A failed plan is tried again every resync interval and settles once
// the apply succeeds.
func TestFailedPlanRetriedOnResync(t *testing.T) {
	e := newEnv(t)
	dr, err := NewDirRuntime(filepath.Join(t.TempDir(), "modules"))
	if err != nil {
		t.Fatal(err)
	}
	a := e.startAgent(t, "ace", &failingRuntime{DirRuntime: dr, fails: 1},
		func(c *Config) { c.Resync = 50 * time.Millisecond })
	p1 := e.publishPlan(t, "ace", "", events.PlanModule{Name: "alpha", Build: "broken:1", RunsAs: "ua"})
	e.waitEvent(t, "ace", events.KindSettle, func(m store.Msg) bool {
		s := m.Event.Payload.(*events.Settle)
		return s.Plan == p1 && s.Op == events.OpFailed
	})
	e.waitEvent(t, "ace", events.KindSettle, func(m store.Msg) bool {
		s := m.Event.Payload.(*events.Settle)
		return s.Plan == p1 && s.Op == events.OpApply && s.Module == "alpha"
	})
	if a.Settled() != p1 {
		t.Errorf("settled = %d, want %d", a.Settled(), p1)
	}
}

// A full have is published on start, after every change of what runs,
// and lists each module with its build, state and account.
func TestHavePublishedOnChange(t *testing.T) {
	e := newEnv(t)
	e.startAgent(t, "ace", nil)
	e.waitEvent(t, "ace", events.KindHave, func(m store.Msg) bool {
		return len(m.Event.Payload.(*events.Have).Modules) == 0
	})
	e.publishPlan(t, "ace", "", events.PlanModule{Name: "alpha", Build: "a:1", RunsAs: "ua"},
		events.PlanModule{Name: "bravo", Build: "b:1"})
	m := e.waitEvent(t, "ace", events.KindHave, func(m store.Msg) bool {
		return len(m.Event.Payload.(*events.Have).Modules) == 2
	})
	want := []events.HaveModule{{Name: "alpha", Build: "a:1", State: events.Running, Account: "ua"},
		{Name: "bravo", Build: "b:1", State: events.Running}}
	if got := m.Event.Payload.(*events.Have).Modules; !slices.Equal(got, want) {
		t.Errorf("have = %+v, want %+v", got, want)
	}
	e.publishPlan(t, "ace", "", events.PlanModule{Name: "bravo", Build: "b:1"})
	e.waitEvent(t, "ace", events.KindHave, func(m store.Msg) bool {
		h := m.Event.Payload.(*events.Have)
		return len(h.Modules) == 1 && h.Modules[0].Name == "bravo"
	})
}

// An agent that starts with no plan in the stream says so in its haves
// (no_plan), so that the reconciler publishes the node's plan again when
// the stream's max-age removed it (a fresh user's finding U28); once a
// plan settles, its haves no longer say so. An agent that starts with a
// plan never says so.
func TestHaveSaysNoPlanUntilOneSettles(t *testing.T) {
	e := newEnv(t)
	e.startAgent(t, "ace", nil)
	first := e.waitEvent(t, "ace", events.KindHave, func(m store.Msg) bool { return m.Event.Payload.(*events.Have).NoPlan })
	p := e.publishPlan(t, "ace", "", events.PlanModule{Name: "alpha", Build: "a:1"})
	// The have says up to where the agent looked (a fresh user's finding
	// V1): before the plan published after its start, so that the
	// reconciler does not take its haves sent while it applies that plan
	// for a plan lost.
	if lb := first.Event.Payload.(*events.Have).LookedBefore; lb == 0 || lb > p {
		t.Errorf("no_plan have #%d says looked_before=%d, want 1..%d (the plan published after the agent looked is #%d)", first.Event.Seq, lb, p, p)
	}
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p))
	h := e.waitEvent(t, "ace", events.KindHave, func(m store.Msg) bool {
		return m.Event.Seq > p && len(m.Event.Payload.(*events.Have).Modules) == 1
	})
	if h.Event.Payload.(*events.Have).NoPlan {
		t.Errorf("have #%d after plan %d settled says no_plan", h.Event.Seq, p)
	}

	e.publishPlan(t, "bob", "", events.PlanModule{Name: "alpha", Build: "a:1"})
	e.startAgent(t, "bob", nil)
	e.waitEvent(t, "bob", events.KindHave, func(m store.Msg) bool { return len(m.Event.Payload.(*events.Have).Modules) == 1 })
	for _, m := range e.events(t, "bob", events.KindHave) {
		if m.Event.Payload.(*events.Have).NoPlan {
			t.Errorf("have #%d of an agent that started with a plan says no_plan", m.Event.Seq)
		}
	}
}

// A resync have is published every Resync even when nothing changes.
func TestHaveResync(t *testing.T) {
	e := newEnv(t)
	e.startAgent(t, "ace", nil, func(c *Config) { c.Resync = 20 * time.Millisecond })
	var n int
	e.waitEvent(t, "ace", events.KindHave, func(store.Msg) bool { n++; return n == 3 })
}

// On start the agent applies the node's newest plan (not the older ones)
// and follows newer plans from there; a restart re-applies the newest
// plan as a no-op and settles it with an empty module.
func TestStartAppliesNewestPlanAndRestart(t *testing.T) {
	e := newEnv(t)
	e.publishPlan(t, "ace", "", events.PlanModule{Name: "old", Build: "o:1"})
	p2 := e.publishPlan(t, "ace", "", events.PlanModule{Name: "alpha", Build: "a:1"})
	dir := t.TempDir()
	root, state := filepath.Join(dir, "root"), filepath.Join(dir, "state")
	a := e.startAgentIn(t, "ace", root, state, nil)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p2))
	if got := brief(settlesOf(t, e, "ace", p2)); got != "alpha:apply" {
		t.Errorf("settles of the newest plan: %q", got)
	}
	if _, err := os.Stat(filepath.Join(root, ReservedDir, "modules", "old.json")); err == nil {
		t.Errorf("an older plan was applied")
	}
	p3 := e.publishPlan(t, "ace", "", events.PlanModule{Name: "alpha", Build: "a:2"})
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p3))
	a.stop()
	// Asked on the way out, not awaited (store.DropOrdered): gone well
	// before their inactivity threshold would remove them.
	waitfor.Until(t, store.OrderedInactive/3, "no consumer left on the server after the agent stopped", func() bool {
		info, err := e.stream.Info(ctxT(t))
		return err == nil && info.State.Consumers == 0
	})

	e.startAgentIn(t, "ace", root, state, nil)
	var n int
	e.waitEvent(t, "ace", events.KindSettle, func(m store.Msg) bool {
		if m.Event.Payload.(*events.Settle).Plan == p3 {
			n++
		}
		return n == 2
	})
	if got := brief(settlesOf(t, e, "ace", p3)); got != "alpha:apply :apply" {
		t.Errorf("settles of plan %d across the restart: %q, want the apply then an empty one", p3, got)
	}
}

// New refuses a state directory inside the root, where a fill could
// overwrite the key, and a bad node name.
func TestNewRefusesBadConfig(t *testing.T) {
	e := newEnv(t)
	root := t.TempDir()
	dr, _ := NewDirRuntime(filepath.Join(t.TempDir(), "m"))
	if _, err := New(e.nc, e.js, Config{Name: "ace", Root: root, StateDir: filepath.Join(root, "state"), Runtime: dr}); err == nil {
		t.Error("state dir inside the root accepted")
	}
	if _, err := os.Stat(filepath.Join(root, "state")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refused state dir was made (%v)", err)
	}
	if _, err := New(e.nc, e.js, Config{Name: "Ace!", Root: root, StateDir: t.TempDir(), Runtime: dr}); !errors.Is(err, events.ErrInvalid) {
		t.Errorf("bad name: %v", err)
	}
	if _, err := New(e.nc, e.js, Config{Name: "ace", Root: filepath.Join(root, "missing"), StateDir: t.TempDir(), Runtime: dr}); err == nil {
		t.Error("missing root accepted")
	}
}

// The BeforePublish hook sees every event the agent publishes, before it
// is appended.
func TestFaultsBeforePublish(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	seen := map[events.Kind]int{}
	e.startAgent(t, "ace", nil, func(c *Config) {
		c.Faults.BeforePublish = func(p events.Payload) {
			mu.Lock()
			seen[p.Kind()]++
			mu.Unlock()
		}
	})
	seq := e.publishPlan(t, "ace", "", events.PlanModule{Name: "alpha", Build: "a:1"})
	e.waitEvent(t, "ace", events.KindSettle, settleOf(seq))
	e.fill(t, "ace", "alpha", "/etc/x", "prov", []byte(secret))
	// The start have goes out on its own goroutine, which a loaded machine
	// may not have run yet: wait until one is stored (the hook ran before).
	e.waitEvent(t, "ace", events.KindHave, func(store.Msg) bool { return true })
	mu.Lock()
	defer mu.Unlock()
	if seen[events.KindHave] == 0 || seen[events.KindSettle] != 1 || seen[events.KindRefusal] != 1 {
		t.Errorf("hook saw %v, want have, one settle, one refusal", seen)
	}
}

// gatedRuntime blocks the apply of builds named "slow" until open is
// closed, and says when one has begun.
type gatedRuntime struct {
	*DirRuntime
	entered chan struct{}
	open    chan struct{}
}

func (g *gatedRuntime) Apply(ctx context.Context, m events.PlanModule) error {
	if strings.HasPrefix(m.Build, "slow") {
		g.entered <- struct{}{}
		<-g.open
	}
	return g.DirRuntime.Apply(ctx, m)
}

// Plans stored while the agent was busy (or away) are not replayed one by
// one: the agent applies the newest, and the superseded ones never settle.
func TestSupersededPlansSkipped(t *testing.T) {
	e := newEnv(t)
	dr, err := NewDirRuntime(filepath.Join(t.TempDir(), "modules"))
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedRuntime{DirRuntime: dr, entered: make(chan struct{}, 1), open: make(chan struct{})}
	a := e.startAgent(t, "ace", g)
	p1 := e.publishPlan(t, "ace", "prov", events.PlanModule{Name: mbg, Build: "slow:1", RunsAs: "mbg"})
	<-g.entered // applying p1, blocked
	var skipped []uint64
	for i := 2; i <= 4; i++ {
		skipped = append(skipped, e.publishPlan(t, "ace", "prov", events.PlanModule{Name: mbg, Build: fmt.Sprintf("g:%d", i), RunsAs: "mbg"}))
	}
	p5 := e.publishPlan(t, "ace", "prov", events.PlanModule{Name: mbg, Build: "g:5", RunsAs: "mbg"})
	close(g.open)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p1))
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p5))
	if a.Settled() != p5 {
		t.Fatalf("settled %d, want %d", a.Settled(), p5)
	}
	for _, m := range e.events(t, "ace", events.KindSettle) {
		if slices.Contains(skipped, m.Event.Payload.(*events.Settle).Plan) {
			t.Errorf("superseded plan %d was applied and settled", m.Event.Payload.(*events.Settle).Plan)
		}
	}
}

// One agent speaks for a node: a second agent of the same node is
// refused at start with an error naming the first (host, pid, since), and
// publishes nothing; the first keeps running. Once the first stops
// cleanly, its lease is released and a new agent starts at once.
func TestSecondAgentRefused(t *testing.T) {
	e := newEnv(t)
	p1 := e.publishPlan(t, "ace", "", events.PlanModule{Name: "alpha", Build: "a:1"})
	a := e.startAgent(t, "ace", nil)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p1))

	dir := t.TempDir()
	dr, err := NewDirRuntime(filepath.Join(dir, "modules"))
	if err != nil {
		t.Fatal(err)
	}
	// Any have the refused agent published would name bravo.
	if err := dr.Apply(ctxT(t), events.PlanModule{Name: "bravo", Build: "b:1"}); err != nil {
		t.Fatal(err)
	}
	b, err := New(e.nc, e.js, Config{Name: "ace", Root: t.TempDir(), StateDir: filepath.Join(dir, "state"), Runtime: dr, Stream: e.cfg})
	if err != nil {
		t.Fatal(err)
	}
	err = b.Run(ctxT(t))
	var held *store.HeldError
	if !errors.As(err, &held) || !errors.Is(err, store.ErrLeaseHeld) {
		t.Fatalf("second agent: %v, want refused with a HeldError", err)
	}
	host, _ := os.Hostname()
	for _, s := range []string{"node ace", "host " + host, "pid " + strconv.Itoa(os.Getpid()), "since "} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	if got, _ := dr.Running(ctxT(t)); len(got) != 1 || got[0].Name != "bravo" {
		t.Errorf("the refused agent applied or removed: its runtime holds %v", got)
	}
	p2 := e.publishPlan(t, "ace", "", events.PlanModule{Name: "alpha", Build: "a:2"})
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p2))
	e.waitEvent(t, "ace", events.KindHave, func(m store.Msg) bool {
		h := m.Event.Payload.(*events.Have)
		return len(h.Modules) == 1 && h.Modules[0].Build == "a:2"
	})
	// No have names bravo: the refused agent published none. (Counting
	// haves is racy: the have of p1 may be stored before or after its
	// settle.)
	for _, m := range e.events(t, "ace", events.KindHave) {
		for _, mod := range m.Event.Payload.(*events.Have).Modules {
			if mod.Name == "bravo" {
				t.Errorf("have seq %d names bravo: the refused agent published", m.Event.Seq)
			}
		}
	}

	a.stop()
	// The clean stop is said, with what it leaves (a fresh user's
	// finding U24: nothing told it from a kill -9).
	if want := "node agent stopping: lease released; 1 module keeps running (adopted at next start)"; !strings.Contains(a.logs.String(), want) {
		t.Errorf("the stopped agent's log does not say %q:\n%s", want, a.logs.String())
	}
	c := e.startAgentIn(t, "ace", a.root, a.state, nil)
	e.waitEvent(t, "ace", events.KindSettle, func(m store.Msg) bool {
		return m.Event.Payload.(*events.Settle).Plan == p2 && m.Event.Payload.(*events.Settle).Module == ""
	})
	if !strings.Contains(c.logs.String(), "node lease held") || strings.Contains(c.logs.String(), "waiting for a renewal") {
		t.Errorf("the next agent did not take the released lease at once:\n%s", c.logs.String())
	}
}

// mappedRuntime runs every module as one account, whatever its runs_as,
// like the process runtime of an agent that is not root.
type mappedRuntime struct {
	*DirRuntime
	mu      sync.Mutex
	applies int
}

const mappedAccount = "agent-user"

func (m *mappedRuntime) RunningAs(string) string { return mappedAccount }

func (m *mappedRuntime) Apply(ctx context.Context, row events.PlanModule) error {
	m.mu.Lock()
	m.applies++
	m.mu.Unlock()
	return m.DirRuntime.Apply(ctx, row)
}

func (m *mappedRuntime) Running(ctx context.Context) ([]events.HaveModule, error) {
	hv, err := m.DirRuntime.Running(ctx)
	for i := range hv {
		hv[i].Account = mappedAccount
	}
	return hv, err
}

// A row that runs, as the account its runtime maps its runs_as to, is not
// applied again by a newer plan.
func TestMappedAccountIsNotReapplied(t *testing.T) {
	e := newEnv(t)
	dr, err := NewDirRuntime(filepath.Join(t.TempDir(), "modules"))
	if err != nil {
		t.Fatal(err)
	}
	rt := &mappedRuntime{DirRuntime: dr}
	e.startAgent(t, "ace", rt)
	row := events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: creds, Mode: "0600"}}}
	p1 := e.publishPlan(t, "ace", "prov", row)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p1))
	p2 := e.publishPlan(t, "ace", "prov", row)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p2))
	for _, s := range settlesOf(t, e, "ace", p2) {
		if s.Module != "" {
			t.Errorf("plan %d settle %+v: the unchanged row was applied again", p2, s)
		}
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.applies != 1 {
		t.Errorf("%d applies, want 1", rt.applies)
	}
}

// missingBuildRuntime fails to apply build until pushed is closed, as a
// runtime does whose build is not in the builds bucket yet; each failed
// attempt is sent on tried when someone listens.
type missingBuildRuntime struct {
	*DirRuntime
	build  string
	pushed chan struct{}
	tried  chan struct{}
}

func (r *missingBuildRuntime) Apply(ctx context.Context, m events.PlanModule) error {
	if m.Build == r.build {
		select {
		case <-r.pushed:
		default:
			select {
			case r.tried <- struct{}{}:
			default:
			}
			return fmt.Errorf("fetch build %s: not in bucket MESH_BUILDS: push it", m.Build)
		}
	}
	return r.DirRuntime.Apply(ctx, m)
}

// A plan whose build is missing settles by itself once the build is
// there, with no restart and long before Resync: the failed apply is
// retried with backoff (1 s doubling), the repeated failure is reported
// once, and the retry that succeeds publishes the plan's settle once.
func TestFailedApplyRetriedUntilBuildPushed(t *testing.T) {
	e := newEnv(t)
	dr, err := NewDirRuntime(filepath.Join(t.TempDir(), "modules"))
	if err != nil {
		t.Fatal(err)
	}
	build := "sha256:" + strings.Repeat("0", 64)
	rt := &missingBuildRuntime{DirRuntime: dr, build: build, pushed: make(chan struct{}), tried: make(chan struct{})}
	a := e.startAgent(t, "ace", rt) // Resync: the default, 10 min
	p1 := e.publishPlan(t, "ace", "", events.PlanModule{Name: "web", Build: build, RunsAs: "web"})
	e.waitEvent(t, "ace", events.KindSettle, func(m store.Msg) bool {
		s := m.Event.Payload.(*events.Settle)
		return s.Plan == p1 && s.Op == events.OpFailed && strings.Contains(s.Error, "not in bucket")
	})
	deadline := time.After(10 * time.Second)
	select { // a retry, failing the same way
	case <-rt.tried:
	case <-deadline:
		t.Fatal("no retry of the failed apply within 10 s")
	}
	close(rt.pushed) // meshfold build push
	e.waitEvent(t, "ace", events.KindSettle, func(m store.Msg) bool {
		s := m.Event.Payload.(*events.Settle)
		return s.Plan == p1 && s.Op == events.OpApply && s.Module == "web"
	})
	if a.Settled() != p1 {
		t.Fatalf("settled = %d, want %d", a.Settled(), p1)
	}
	// A later plan settles after every settle of p1 (plan order).
	p2 := e.publishPlan(t, "ace", "", events.PlanModule{Name: "web", Build: build, RunsAs: "web"},
		events.PlanModule{Name: "img", Build: "img:1", RunsAs: "img"})
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p2))
	got := settlesOf(t, e, "ace", p1)
	if len(got) != 2 || got[0].Op != events.OpFailed || got[1].Op != events.OpApply {
		t.Errorf("plan %d: settles %s, want one failure then one apply", p1, brief(got))
	}
}

// An agent whose lease expired while it lived (the bucket's leader
// crashed, no renewal was stored for the TTL) and that claims it again
// publishes a have after the down a reconciler recorded for the expiry,
// whether that down was stored before the re-claim (ace) or after it
// (bob, judged by a reconciler before the re-claim and stored late): a
// rollout reads a have from before a down as stale, and nothing else made
// the agent publish one while nothing changed on the node, so its target
// never became healthy again (a fresh user's finding, G1).
func TestHaveAfterLeaseReclaim(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	const ttl = 2 * time.Second
	kv, err := store.CreateKV(ctx, e.js, jetstream.KeyValueConfig{Bucket: e.cfg.Name + store.NodeLeaseBucketSuffix,
		History: 1, TTL: ttl, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	down := func(node string) uint64 {
		t.Helper()
		ack, err := e.pub.Append(ctxT(t), node, events.Stamp(&events.Agent{State: events.AgentDown, Claim: "c", Why: events.WhyExpired}, time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Seq
	}
	// expire deletes node's lease, as its expiry does, and waits for its
	// agent's re-claim (a put after the delete).
	expire := func(node string) {
		t.Helper()
		e1, err := kv.Get(ctxT(t), node)
		if err != nil {
			t.Fatal(err)
		}
		if err := kv.Delete(ctxT(t), node); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(wait)
		for {
			e2, err := kv.Get(ctxT(t), node)
			if err == nil && e2.Revision() > e1.Revision()+1 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's agent did not claim its lease again", node)
			}
			<-time.After(50 * time.Millisecond) // polling the bucket
		}
	}
	haveAfter := func(node string, seq uint64) {
		t.Helper()
		e.waitEvent(t, node, events.KindHave, func(m store.Msg) bool { return m.Event.Seq > seq })
	}
	for _, n := range []string{"ace", "bob"} {
		e.startAgent(t, n, nil)
		e.waitEvent(t, n, events.KindHave, func(store.Msg) bool { return true })
	}

	d := down("ace")
	expire("ace")
	haveAfter("ace", d)

	expire("bob")
	d = down("bob")
	haveAfter("bob", d)
}

// gatedSupRuntime is a gatedRuntime with the Supervisor interface: the
// test says when a module's state changed.
type gatedSupRuntime struct {
	*gatedRuntime
	changes chan struct{}
}

func (g *gatedSupRuntime) Changes() <-chan struct{}       { return g.changes }
func (g *gatedSupRuntime) Filled(context.Context, string) {}

// A have sent while the agent applies its first plan, after the modules
// it started changed and before the plan settles, does not say the agent
// holds no plan (a fresh user's finding m2: `audit` said "holds no plan
// (none in the stream at the agent's start)" of the have listing the
// plan's first module): the agent holds the plan it applies.
func TestHaveWhileApplyingSaysPlanHeld(t *testing.T) {
	e := newEnv(t)
	dr, err := NewDirRuntime(filepath.Join(t.TempDir(), "modules"))
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedSupRuntime{gatedRuntime: &gatedRuntime{DirRuntime: dr, entered: make(chan struct{}, 1), open: make(chan struct{})},
		changes: make(chan struct{}, 1)}
	e.startAgent(t, "ace", g)
	e.waitEvent(t, "ace", events.KindHave, func(m store.Msg) bool { return m.Event.Payload.(*events.Have).NoPlan })
	p := e.publishPlan(t, "ace", "", events.PlanModule{Name: "alpha", Build: "a:1"}, events.PlanModule{Name: "bravo", Build: "slow:1"})
	<-g.entered // alpha applied, bravo's apply blocked: the plan is not settled
	g.changes <- struct{}{}
	h := e.waitEvent(t, "ace", events.KindHave, func(m store.Msg) bool { return len(m.Event.Payload.(*events.Have).Modules) == 1 })
	close(g.open)
	if h.Event.Payload.(*events.Have).NoPlan {
		t.Errorf("have #%d, sent while plan #%d was applied (alpha running), says no_plan", h.Event.Seq, p)
	}
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p))
}
