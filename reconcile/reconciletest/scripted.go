package reconciletest

import (
	"fmt"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// rng is splitmix64: a seeded, dependency-free generator, so the package
// needs no math/rand.
type rng struct{ x uint64 }

func (r *rng) next() uint64 {
	r.x += 0x9e3779b97f4a7c15
	z := r.x
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// intn returns a number in [0, n).
func (r *rng) intn(n int) int { return int(r.next() % uint64(n)) }

func (r *rng) chance(percent int) bool { return r.intn(100) < percent }

// moduleSpec is one module the generator may want.
type moduleSpec struct {
	name     string
	files    []events.File
	runsAs   string
	prov     bool
	approval bool
}

var specs = []moduleSpec{
	{name: "provisioner", runsAs: "prov", prov: true},
	{name: "postgres", runsAs: "pg", files: []events.File{{Path: "/etc/postgres/pg.creds", Mode: "0600"}}},
	{name: "nats", runsAs: "nats", approval: true, files: []events.File{{Path: "/etc/nats/nats.creds", Mode: "0600"}}},
	{name: "restic", runsAs: "restic", files: []events.File{{Path: "/etc/restic/key", Mode: "0400"}, {Path: "/etc/restic/repo.env", Mode: "0600"}}},
	{name: "mesh-build-go", runsAs: "mbg", files: []events.File{{Path: "/run/mesh-build-go/broker.creds", Mode: "0600"}}},
}

// Scripted returns a stream of inputs input events spread over nodes
// (round robin with random skips), each followed by the effects the fold
// makes, so the stream holds more than inputs events. The history is a
// function of seed: wants that add, drop and move modules (some requiring
// approval, some held), approvals before and after, settles of the plans
// in order (some failed, some of older plans), operator events (pause,
// resume, poke, revoke, waive, retire), haves (sometimes naming
// another provisioner account), refusals of every reason judged by the
// settled plan, plan 0 or an older plan, fills, and now and then a
// malformed event or one naming a plan that does not exist yet.
//
// Event N happens at base + N seconds. live, when not nil, becomes the
// stream's Live hook while it is built.
func Scripted(nodes []string, inputs int, seed uint64, live func(events.Event, *reconcile.State)) *Stream {
	s := New(time.Date(2026, 11, 3, 20, 0, 0, 0, time.UTC), time.Second)
	s.Live = live
	g := &gen{s: s, r: &rng{x: seed}}
	for i := 0; i < inputs; i++ {
		node := nodes[i%len(nodes)]
		if g.r.chance(20) {
			node = nodes[g.r.intn(len(nodes))]
		}
		g.step(node)
	}
	return s
}

type gen struct {
	s     *Stream
	r     *rng
	ops   int // operator events appended so far
	haves int // haves appended so far
}

func (g *gen) build(name string) string { return fmt.Sprintf("%s:%d", name[:1], 1+g.r.intn(3)) }

func (g *gen) step(node string) {
	st := g.s.State(node)
	r := g.r
	if st.Want == nil {
		g.want(node)
		return
	}
	switch k := r.intn(100); {
	case k < 14:
		g.want(node)
	case k < 17:
		m := specs[r.intn(len(specs))]
		g.s.Append(node, &events.Approve{Module: m.name, Build: g.build(m.name), By: "alice"})
	case k < 20:
		g.operator(node)
	case k < 45:
		g.settle(node)
	case k < 60:
		g.have(node)
	case k < 82:
		g.refusal(node)
	case k < 96:
		g.filled(node)
	case k < 98:
		g.s.AppendRaw(node, events.KindHave, []byte(`{"v":1,"at":"2026-11-03T20:00:00Z","modules":"nope"}`))
	default:
		// A settle naming a plan that does not exist yet: journaled.
		g.s.Append(node, &events.Settle{Module: "postgres", Op: events.OpApply, Plan: st.NewestPlan + 1000})
	}
}

// operator appends one of the operator events of DESIGN.md §9, or an ack.
func (g *gen) operator(node string) {
	r := g.r
	m, path := g.target()
	// In turn, so that every kind shows up in a short history.
	g.ops++
	switch g.ops % 8 {
	case 0:
		g.s.Append(node, &events.Pause{By: "alice", Reason: "maintenance"})
	case 1:
		g.s.Append(node, &events.Resume{By: "alice"})
	case 2:
		g.s.Append(node, &events.Poke{By: "bob"})
	case 3:
		n := specs[r.intn(len(specs))]
		g.s.Append(node, &events.Revoke{Module: n.name, Build: g.build(n.name), By: "carol"})
	case 4:
		g.s.Append(node, &events.Waive{Module: m, Path: path, By: "dave"})
	case 5:
		// Some way back, or up to the ack itself (issue 25).
		var upto uint64
		if last := g.s.Next() - 1; last > 0 && r.chance(50) {
			upto = 1 + uint64(r.intn(int(last)))
		}
		g.s.Append(node, &events.Ack{By: "frank", Upto: upto})
	case 6:
		// A gate, or its lift (DESIGN.md §4, "the gate").
		n := specs[r.intn(len(specs))]
		g.s.Append(node, &events.Gate{Module: n.name, Lift: r.chance(50), By: "grace"})
	default:
		g.s.Append(node, &events.Retire{By: "erin", Force: r.chance(30)})
	}
}

func (g *gen) want(node string) {
	w := &events.Want{}
	for i, m := range specs {
		if i > 0 && g.r.chance(35) {
			continue
		}
		wm := events.WantModule{Name: m.name, Build: g.build(m.name), RunsAs: m.runsAs, Files: m.files,
			Provisioner: m.prov, RequiresApproval: m.approval}
		if m.prov && g.r.chance(10) {
			wm.RunsAs = "" // a provisioner composed with no account (incident 3)
		}
		if g.r.chance(8) {
			wm.Hold = true
		}
		w.Modules = append(w.Modules, wm)
	}
	g.s.Append(node, w)
}

func (g *gen) settle(node string) {
	st := g.s.State(node)
	var plan uint64
	for _, p := range st.Unsettled {
		if p.Seq != 0 {
			plan = p.Seq
			break
		}
	}
	if plan == 0 || g.r.chance(10) {
		if st.Settled == nil {
			return
		}
		plan = st.Settled.Seq // a settle of the settled plan: changes nothing more
	}
	op := events.OpApply
	module := ""
	if e := st.Emitted(); e != nil && len(e.Modules) > 0 && g.r.chance(80) {
		module = e.Modules[g.r.intn(len(e.Modules))].Name
	}
	errText := ""
	if g.r.chance(6) {
		op, errText = events.OpFailed, "image pull failed"
	}
	// Half the refusals of a plan as a whole are for its signer (the
	// answer publishes the plan again), drawn without a random number so
	// that the scripts' other draws stay as they were.
	untrusted := op == events.OpFailed && module == "" && plan%2 == 0
	g.s.Append(node, &events.Settle{Module: module, Op: op, Plan: plan, Error: errText, Untrusted: untrusted})
}

func (g *gen) have(node string) {
	st := g.s.State(node)
	// Every fourth have, the agent goes down before it (and comes back
	// with it), or a new claim is recorded up: no draw of the generator,
	// so the rest of the history is what it was before agent events.
	g.haves++
	if g.haves%4 == 0 {
		claim := fmt.Sprintf("claim-%d", g.haves)
		if a := st.Agent; a == nil || a.Up {
			g.s.Append(node, &events.Agent{State: events.AgentDown, Claim: claim, Host: "h1", PID: g.haves, Why: events.WhyExpired})
		} else {
			g.s.Append(node, &events.Agent{State: events.AgentUp, Claim: claim, Host: "h1", PID: g.haves})
		}
		st = g.s.State(node)
	}
	// Every eighth have (four after the agent's turn), the provisioner's
	// lease goes down or comes back, with no draw either.
	if g.haves%8 == 2 {
		claim := fmt.Sprintf("prov-%d", g.haves)
		if p := st.Provisioner; p == nil || p.Up {
			g.s.Append(node, &events.Prov{Agent: events.Agent{State: events.AgentDown, Claim: claim, Host: "h1", PID: g.haves, Why: events.WhyExpired}})
		} else {
			g.s.Append(node, &events.Prov{Agent: events.Agent{State: events.AgentUp, Claim: claim, Host: "h1", PID: g.haves}})
		}
		st = g.s.State(node)
	}
	h := &events.Have{}
	if st.Settled != nil {
		for _, row := range st.Settled.Modules {
			if row.Build == "" {
				continue
			}
			hm := events.HaveModule{Name: row.Name, Build: row.Build, State: events.Running, Account: row.RunsAs}
			if row.Provisioner && g.r.chance(15) {
				hm.Account = "prov-old"
			}
			if g.r.chance(10) {
				hm.State = events.Failed
			}
			h.Modules = append(h.Modules, hm)
		}
	}
	g.s.Append(node, h)
}

// target picks a module and path: usually a declared one.
func (g *gen) target() (string, string) {
	m := specs[1+g.r.intn(len(specs)-1)]
	return m.name, m.files[g.r.intn(len(m.files))].Path
}

// plan picks the plan a write is judged by: the settled one, mostly.
func (g *gen) plan(node string) uint64 {
	st := g.s.State(node)
	switch {
	case st.Settled != nil && g.r.chance(70):
		return st.Settled.Seq
	case st.NewestPlan > 0 && g.r.chance(50):
		return 1 + uint64(g.r.intn(int(st.NewestPlan)))
	}
	return 0
}

func (g *gen) refusal(node string) {
	module, path := g.target()
	reasons := []events.Reason{events.ReasonUndeclared, events.ReasonNoAccount, events.ReasonWrongAccount, events.ReasonWriteFailed}
	writer := "prov"
	if g.r.chance(15) {
		writer = "prov-old"
	}
	rf := &events.Refusal{Module: module, Path: path, Reason: reasons[g.r.intn(len(reasons))], Plan: g.plan(node), Writer: writer}
	if rf.Reason == events.ReasonWriteFailed {
		rf.Error = "disk full"
	}
	g.s.Append(node, rf)
}

func (g *gen) filled(node string) {
	module, path := g.target()
	g.s.Append(node, &events.Filled{Module: module, Path: path, Plan: g.plan(node), Digest: fmt.Sprintf("hmac-%016x", g.r.next())})
}
