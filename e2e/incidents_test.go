package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node"
)

// incident1 plays DESIGN.md §2 incident 1 on node ace up to the moment the
// node applies the want that declares the credential: the provisioner ran
// ahead of the node and its write was refused as undeclared, judged by the
// plan the node had settled. The node's apply of mesh-build-go waits on
// the returned gate. restart, when set, runs at that moment.
func incident1(t *testing.T, m *mesh, restart func(n *nodeT, g *gate)) (n *nodeT, p1, p2 uint64) {
	return incident1With(t, m, nil, restart)
}

// incident1With is incident1 with the node's runtime (the gate over a
// DirRuntime) wrapped by wrap, when not nil.
func incident1With(t *testing.T, m *mesh, wrap func(n *nodeT, rt node.Runtime) node.Runtime, restart func(n *nodeT, g *gate)) (n *nodeT, p1, p2 uint64) {
	ctx := m.ctx()
	n = m.newNode("ace")
	n.source(mbg, creds, secret)
	g := newGate(n.dirRuntime(), mbg)
	var rt node.Runtime = g
	if wrap != nil {
		rt = wrap(n, g)
	}
	n.startAgent(rt)
	n.startProvisioner("prov")

	w1 := must(m.want(ctx, "ace", provisionerMod))(t)
	p1, _ = must2(m.planOf(ctx, "ace", w1))(t)
	must(m.settled(ctx, "ace", p1))(t)
	n.nextFill(t, ctx) // the provisioner's fill on start: nothing declared yet

	// The controller declares the credential; the reconciler plans it; the
	// node starts applying it (held at the gate).
	w2 := must(m.want(ctx, "ace", provisionerMod, mbgMod))(t)
	p2, _ = must2(m.planOf(ctx, "ace", w2))(t)
	select {
	case <-g.entered:
	case <-ctx.Done():
		t.Fatal("the node never applied the new plan")
	}
	// A provisioner that read the new plan fills before the node settled
	// it: refused as undeclared, judged by p1.
	r := must(n.fillOnce(ctx, "prov"))(t)
	if len(r.Refused) != 1 || r.Refused[0].Reason != events.ReasonUndeclared {
		t.Fatalf("early fill: %+v, want refused undeclared", r)
	}
	must(m.waitEvent(ctx, "ace", events.KindRefusal, func(ev events.Event) bool {
		rf := ev.Payload.(*events.Refusal)
		return rf.Path == creds && rf.Plan == p1 && rf.Reason == events.ReasonUndeclared
	}))(t)
	if restart != nil {
		restart(n, g)
	}
	close(g.open)
	return n, p1, p2
}

// healed checks the end of incident 1: the credential on disk with its
// content and mode, exactly one knock carrying the refused item, nothing
// owed.
func healed(t *testing.T, m *mesh, n *nodeT, p1, p2 uint64) {
	t.Helper()
	ctx := m.ctx()
	must(m.filled(ctx, "ace", creds, p2))(t)
	content, mode, err := n.file(creds)
	if err != nil || content != secret || mode != 0o600 {
		t.Fatalf("credential: %q mode %v, %v; want the content with mode 0600", content, mode, err)
	}
	if owed := must(m.quiesce(ctx, "ace"))(t); owed != 0 {
		t.Errorf("%d items still owed", owed)
	}
	knocks := must(m.events(ctx, "ace", events.KindKnock))(t)
	if len(knocks) != 1 {
		t.Fatalf("%d knocks, want exactly 1", len(knocks))
	}
	k := knocks[0].Payload.(*events.Knock)
	want := events.Owed{Module: mbg, Path: creds, Reason: events.ReasonUndeclared, Plan: p1, Writer: "prov"}
	if len(k.Owed) != 1 || k.Owed[0] != want || len(k.Reasons) != 1 || k.Reasons[0] != events.KnockDeclared {
		t.Errorf("knock = %+v, want one declared knock owing %+v", k, want)
	}
	m.assertNoLeak()
}

// Incident 1: a refused write is tried again once the apply that allows
// it settles: one knock, and the provisioner fills the file.
func TestIncident1RefusedWriteIsKnocked(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	n, p1, p2 := incident1(t, m, nil)
	healed(t, m, n, p1, p2)
}

// Incident 1 with each component restarted in turn in the middle of it:
// the file still ends written and exactly one knock is published.
func TestIncident1Restarts(t *testing.T) {
	t.Parallel()
	t.Run("node agent", func(t *testing.T) {
		m := newMesh(t)
		n, p1, p2 := incident1(t, m, func(n *nodeT, g *gate) {
			// Stopped while applying; the new agent applies the newest plan
			// on start.
			n.agent.stop(t)
			n.startAgent(nil)
		})
		healed(t, m, n, p1, p2)
	})
	t.Run("provisioner", func(t *testing.T) {
		m := newMesh(t)
		n, p1, p2 := incident1(t, m, func(n *nodeT, g *gate) { n.provisioner.stop(t) })
		// The knock is published while the provisioner is down; its fill on
		// start covers it.
		ctx := m.ctx()
		must(m.waitEvent(ctx, "ace", events.KindKnock, func(events.Event) bool { return true }))(t)
		n.startProvisioner("prov")
		healed(t, m, n, p1, p2)
	})
	t.Run("reconciler", func(t *testing.T) {
		m := newMesh(t)
		n, p1, p2 := incident1(t, m, func(n *nodeT, g *gate) {
			m.reconciler.stop(t)
			m.rc.Store(nil)
		})
		// The settle lands while no reconciler runs; a new one folds it
		// (from its snapshot) and knocks once.
		ctx := m.ctx()
		must(m.settled(ctx, "ace", p2))(t)
		m.startReconciler()
		must(m.waitEvent(ctx, "ace", events.KindKnock, func(events.Event) bool { return true }))(t)
		// And once more right after the knock: nothing is published twice.
		m.restartReconciler()
		healed(t, m, n, p1, p2)
	})
}

// Incident 2: a refusal racing the settle. Each run puts a provisioner's
// fill at a random moment around the node's switch to the plan that
// declares the file (and randomizes the node's apply time), so the write
// is judged by the old plan or the new one and its refusal lands before
// or after the settle in the stream. Every run must end with the file
// written and at most one knock: exactly one when the write was refused.
func TestIncident2RefusalRacesSettle(t *testing.T) {
	t.Parallel()
	runs, parallel := 200, 4
	if testing.Short() {
		runs = 40
	}
	m := newMesh(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	var accepted, refusedBefore, refusedAfter, refusedPaid atomic.Int32
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range runs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			outcome, err := raceOnce(m, fmt.Sprintf("race-%03d", i), rng)
			if err != nil {
				t.Errorf("run %d: %v", i, err)
				return
			}
			switch outcome {
			case "accepted":
				accepted.Add(1)
			case "refused-before-settle":
				refusedBefore.Add(1)
			case "refused-after-settle":
				refusedAfter.Add(1)
			case "refused-paid-by-fill":
				refusedPaid.Add(1)
			}
		})
	}
	wg.Wait()
	t.Logf("%d runs in %s: written directly %d, refusal before the settle %d, refusal after the settle %d, refusal paid by an earlier fill %d",
		runs, time.Since(start).Round(time.Millisecond), accepted.Load(), refusedBefore.Load(), refusedAfter.Load(), refusedPaid.Load())
	m.assertNoLeak()
}

// paidBefore reports whether a filled of the refused file at a newer plan
// than the refusal's reached the stream before the refusal.
func paidBefore(ctx context.Context, m *mesh, node string, refusal events.Event) (bool, error) {
	r := refusal.Payload.(*events.Refusal)
	fills, err := m.events(ctx, node, events.KindFilled)
	if err != nil {
		return false, err
	}
	for _, ev := range fills {
		f := ev.Payload.(*events.Filled)
		if ev.Seq < refusal.Seq && f.Module == r.Module && f.Path == r.Path && f.Plan > r.Plan {
			return true, nil
		}
	}
	return false, nil
}

func dump(evs []events.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		fmt.Fprintf(&b, "#%d %+v ", ev.Seq, ev.Payload)
	}
	return b.String()
}

// slowRuntime delays the Apply of one module by a set time, and closes
// applying when that Apply starts.
type slowRuntime struct {
	node.Runtime
	module   string
	delay    time.Duration
	applying chan struct{}
	once     sync.Once
}

func (j *slowRuntime) Apply(ctx context.Context, m events.PlanModule) error {
	if m.Name == j.module {
		j.once.Do(func() { close(j.applying) })
		time.Sleep(j.delay) // randomized timing under test, not synchronisation
	}
	return j.Runtime.Apply(ctx, m)
}

func raceOnce(m *mesh, name string, rng *rand.Rand) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	n := m.newNode(name)
	n.source(mbg, creds, secret)
	// The node takes applyTime to apply the new module. An eager
	// provisioner that read the new plan fills at a random moment between
	// the start of that apply and 1.5 times its length, so the write is judged
	// by the old plan or the new one, close to the switch.
	applyTime := 2*time.Millisecond + time.Duration(rng.Int64N(int64(4*time.Millisecond)))
	delay := time.Duration(rng.Int64N(int64(3 * applyTime / 2)))
	// The node's report of a refusal reaches the stream after a random
	// network delay, so a refusal judged by the old plan may land after
	// the new plan's settle: the interleaving of the incident.
	netDelay := time.Duration(rng.Int64N(int64(3 * time.Millisecond)))
	slow := &slowRuntime{Runtime: n.dirRuntime(), module: mbg, delay: applyTime, applying: make(chan struct{})}
	n.startAgentFaults(slow, node.Faults{
		BeforePublish: func(p events.Payload) {
			if _, ok := p.(*events.Refusal); ok {
				time.Sleep(netDelay) // randomized timing under test, not synchronisation
			}
		}})
	n.startProvisioner("prov")
	defer n.agent.stop(m.t)
	defer n.provisioner.stop(m.t)
	w1, err := m.want(ctx, name, provisionerMod)
	if err != nil {
		return "", err
	}
	p1, _, err := m.planOf(ctx, name, w1)
	if err != nil {
		return "", err
	}
	if _, err := m.settled(ctx, name, p1); err != nil {
		return "", err
	}
	// The running provisioner's fill on start is done before the race
	// begins: only the eager fill races the settle.
	select {
	case <-n.fills:
	case <-ctx.Done():
		return "", fmt.Errorf("no fill on start")
	}

	type result struct {
		r   string
		err error
	}
	fillDone := make(chan result, 1)
	go func() {
		select {
		case <-slow.applying:
		case <-ctx.Done():
			fillDone <- result{err: fmt.Errorf("the node never applied %s", mbg)}
			return
		}
		time.Sleep(delay) // randomized timing under test, not synchronisation
		r, err := m.fill(ctx, name, mbg, creds, "prov", secret)
		switch {
		case err != nil:
			fillDone <- result{err: err}
		case r.OK:
			fillDone <- result{r: "accepted"}
		default:
			fillDone <- result{r: string(r.Reason)}
		}
	}()
	w2, err := m.want(ctx, name, provisionerMod, mbgMod)
	if err != nil {
		return "", err
	}
	p2, _, err := m.planOf(ctx, name, w2)
	if err != nil {
		return "", err
	}
	var res result
	select {
	case res = <-fillDone:
	case <-ctx.Done():
		return "", fmt.Errorf("no eager fill")
	}
	if res.err != nil {
		return "", res.err
	}
	if res.r != "accepted" && res.r != string(events.ReasonUndeclared) {
		return "", fmt.Errorf("eager fill %s, want accepted or undeclared", res.r)
	}

	// The end: the file written (by the eager fill or the knock's refill),
	// everything folded, and the knocks counted.
	if _, err := m.filled(ctx, name, creds, p2); err != nil {
		return "", err
	}
	if content, mode, err := n.file(creds); err != nil || content != secret || mode != 0o600 {
		return "", fmt.Errorf("file %q mode %v: %v", content, mode, err)
	}
	if _, err := m.settled(ctx, name, p2); err != nil {
		return "", err
	}
	owed, err := m.quiesce(ctx, name)
	if err != nil {
		return "", err
	}
	knocks, err := m.events(ctx, name, events.KindKnock)
	if err != nil {
		return "", err
	}
	if owed != 0 {
		return "", fmt.Errorf("%d items still owed", owed)
	}
	if res.r == "accepted" {
		if len(knocks) != 0 {
			refusals, _ := m.events(ctx, name, events.KindRefusal)
			return "", fmt.Errorf("%d knocks after a write that was accepted, want 0: %s; refusals %s", len(knocks), dump(knocks), dump(refusals))
		}
		return "accepted", nil
	}
	refusals, err := m.events(ctx, name, events.KindRefusal)
	if err != nil || len(refusals) != 1 {
		return "", fmt.Errorf("refusals %d: %v", len(refusals), err)
	}
	if len(knocks) == 0 {
		// No knock is right only when the refusal was already paid: the
		// provisioner, following the new plan, filled the file at a newer
		// plan than the refusal's, and that fill reached the stream first
		// (the refusal's network delay let it by). DESIGN.md §4: a filled
		// at a newer plan pays a refusal that arrives after it.
		paid, err := paidBefore(ctx, m, name, refusals[0])
		if err != nil {
			return "", err
		}
		if paid {
			return "refused-paid-by-fill", nil
		}
		// Otherwise the knock is owed, and may not be stored yet: the
		// reconciler publishes a fold's effects after the fold, and
		// quiesce sees the state folded up to the last input (seen once
		// as a knock stored after the filled that paid its owed item,
		// which the fold had read on to). Wait for it.
		if knocks, err = m.waitEvents(ctx, name, events.KindKnock); err != nil {
			return "", fmt.Errorf("0 knocks after a refused write not paid by an earlier fill (%v), want exactly 1: refusal %s", err, dump(refusals))
		}
	}
	if len(knocks) != 1 {
		return "", fmt.Errorf("%d knocks after a refused write, want exactly 1", len(knocks))
	}
	// Where did the refusal land relative to the settle?
	settles, err := m.events(ctx, name, events.KindSettle)
	if err != nil {
		return "", err
	}
	for _, s := range settles {
		if s.Payload.(*events.Settle).Plan == p2 {
			if refusals[0].Seq > s.Seq {
				return "refused-after-settle", nil
			}
			break
		}
	}
	return "refused-before-settle", nil
}

// Incident 3: a held provisioner keeps its account. The client waits for
// its first approval (no account: writes refused), is placed (knock, files
// filled), then moves to a build that needs approval: held, it keeps
// naming prov and postgres, restic and power keep receiving their files.
// Removing it from the want makes writes refuse no-account and writes a
// journal entry.
func TestIncident3HeldProvisionerKeepsAccount(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ctx := m.ctx()
	n := m.newNode("ace")
	files := map[string]string{"postgres": "/etc/postgres/pw", "restic": "/etc/restic/key", "power": "/etc/power/token"}
	for mod, p := range files {
		n.source(mod, p, secret+"-"+mod)
	}
	prov := events.WantModule{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true, RequiresApproval: true}
	others := []events.WantModule{
		{Name: "postgres", Build: "pg:15", RunsAs: "postgres", Files: []events.File{{Path: files["postgres"], Mode: "0600"}}},
		{Name: "restic", Build: "r:1", RunsAs: "restic", Files: []events.File{{Path: files["restic"], Mode: "0600"}}},
		{Name: "power", Build: "w:1", RunsAs: "power", Files: []events.File{{Path: files["power"], Mode: "0640"}}},
	}
	n.startAgent(nil)

	// First placement waits for its approval: no account, writes refused.
	w1 := must(m.want(ctx, "ace", append([]events.WantModule{prov}, others...)...))(t)
	p1, plan1 := must2(m.planOf(ctx, "ace", w1))(t)
	if plan1.ProvisionerAccount != "" {
		t.Fatalf("plan %d names account %q before the client is placed", p1, plan1.ProvisionerAccount)
	}
	must(m.settled(ctx, "ace", p1))(t)
	n.startProvisioner("prov")
	if pass := n.nextFill(t, ctx); len(pass.r.Refused) != 3 || pass.r.Refused[0].Reason != events.ReasonNoAccount {
		t.Fatalf("fill on start: %+v, want 3 refused no-account", pass.r)
	}

	// The approval places it: the plan names prov, the settle knocks, the
	// files land.
	a1 := must(m.approve(ctx, "ace", "provisioner", "p:1"))(t)
	p2, plan2 := must2(m.planOf(ctx, "ace", a1))(t)
	if plan2.ProvisionerAccount != "prov" {
		t.Fatalf("plan %d names %q, want prov", p2, plan2.ProvisionerAccount)
	}
	for mod, p := range files {
		must(m.filled(ctx, "ace", p, p2))(t)
		if c, _, err := n.file(p); err != nil || c != secret+"-"+mod {
			t.Fatalf("%s: %q, %v", p, c, err)
		}
	}

	// The client moves to p:2, which needs an approval: held, it keeps
	// its account.
	prov2 := prov
	prov2.Build = "p:2"
	w2 := must(m.want(ctx, "ace", append([]events.WantModule{prov2}, others...)...))(t)
	p3, plan3 := must2(m.planOf(ctx, "ace", w2))(t)
	row := plan3.Module("provisioner")
	if plan3.ProvisionerAccount != "prov" || row == nil || !row.Held || row.Build != "p:1" || row.Pending != "p:2" {
		t.Fatalf("plan %d: account %q, row %+v; want held at p:1, pending p:2, account prov", p3, plan3.ProvisionerAccount, row)
	}
	must(m.settled(ctx, "ace", p3))(t)
	for mod, p := range files {
		n.source(mod, p, secret+"-"+mod+"-v2")
	}
	r := must(n.fillOnce(ctx, "prov"))(t)
	if len(r.Filled) != 3 || len(r.Refused) != 0 {
		t.Fatalf("fill while the client is held: %+v, want all 3 filled", r)
	}
	for mod, p := range files {
		if c, _, _ := n.file(p); c != secret+"-"+mod+"-v2" {
			t.Errorf("%s not rewritten while the client is held", p)
		}
	}
	if runs := must(n.runs(ctx))(t); runs["provisioner"].Build != "p:1" {
		t.Errorf("the held client was moved: %+v", runs["provisioner"])
	}

	// Removed from the want: no account, writes refused no-account, and a
	// journal entry says so.
	w3 := must(m.want(ctx, "ace", others...))(t)
	p4, plan4 := must2(m.planOf(ctx, "ace", w3))(t)
	if plan4.ProvisionerAccount != "" {
		t.Fatalf("plan %d still names %q", p4, plan4.ProvisionerAccount)
	}
	j := must(m.waitEvent(ctx, "ace", events.KindJournal, func(ev events.Event) bool {
		return ev.Payload.(*events.Journal).Cause == w3
	}))(t)
	if jj := j.Payload.(*events.Journal); jj.Level != events.LevelWarn || !strings.Contains(jj.Msg, "no provisioner account") {
		t.Errorf("journal = %+v", jj)
	}
	must(m.settled(ctx, "ace", p4))(t)
	r = must(n.fillOnce(ctx, "prov"))(t)
	if len(r.Refused) != 3 || len(r.Filled) != 0 {
		t.Fatalf("fill after removal: %+v, want 3 refused", r)
	}
	for _, rf := range r.Refused {
		if rf.Reason != events.ReasonNoAccount {
			t.Errorf("%s refused %s, want no-account", rf.Path, rf.Reason)
		}
	}
	if _, ok := must(n.runs(ctx))(t)["provisioner"]; ok {
		t.Errorf("the removed client still runs")
	}
	m.assertNoLeak()
}

// Incident 4: nats on novox waits with its new build pending; an approval
// of another build moves nothing; the approval of that build moves it.
func TestIncident4ApprovalMovesHeldModule(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ctx := m.ctx()
	n := m.newNode("novox")
	n.startAgent(nil)
	natsMod := events.WantModule{Name: "nats", Build: "n:1", RunsAs: "nats", RequiresApproval: true}

	a1 := must(m.approve(ctx, "novox", "nats", "n:1"))(t)
	w1 := must(m.want(ctx, "novox", natsMod))(t)
	_ = a1
	p1, _ := must2(m.planOf(ctx, "novox", w1))(t)
	must(m.settled(ctx, "novox", p1))(t)
	if runs := must(n.runs(ctx))(t); runs["nats"].Build != "n:1" {
		t.Fatalf("runs %+v, want nats n:1", runs)
	}

	// The want moves to n:2: taken in, shown as pending, not applied.
	nats2 := natsMod
	nats2.Build = "n:2"
	w2 := must(m.want(ctx, "novox", nats2))(t)
	p2, plan2 := must2(m.planOf(ctx, "novox", w2))(t)
	if row := plan2.Module("nats"); row == nil || !row.Held || row.Why != events.HoldApproval || row.Build != "n:1" || row.Pending != "n:2" {
		t.Fatalf("plan %d row %+v, want held for approval at n:1, pending n:2", p2, row)
	}
	if s := must(m.settled(ctx, "novox", p2))(t); s.Module != "" {
		t.Errorf("settle of the held plan names %q, want no change", s.Module)
	}

	// Another build's approval moves nothing.
	must(m.approve(ctx, "novox", "nats", "n:3"))(t)
	must(m.quiesce(ctx, "novox"))(t)
	plans := must(m.events(ctx, "novox", events.KindPlan))(t)
	if last := plans[len(plans)-1]; last.Seq != p2 {
		t.Fatalf("an approval of n:3 made plan %d", last.Seq)
	}
	if runs := must(n.runs(ctx))(t); runs["nats"].Build != "n:1" {
		t.Fatalf("runs %+v after approving n:3, want n:1", runs)
	}

	// The approval of n:2 moves it.
	a3 := must(m.approve(ctx, "novox", "nats", "n:2"))(t)
	p3, plan3 := must2(m.planOf(ctx, "novox", a3))(t)
	if row := plan3.Module("nats"); row == nil || row.Held || row.Build != "n:2" {
		t.Fatalf("plan %d row %+v, want composed at n:2", p3, row)
	}
	if s := must(m.settled(ctx, "novox", p3))(t); s.Module != "nats" || s.Op != events.OpApply {
		t.Errorf("settle %+v, want nats applied", s)
	}
	if runs := must(n.runs(ctx))(t); runs["nats"].Build != "n:2" {
		t.Errorf("runs %+v, want n:2", runs)
	}
}
