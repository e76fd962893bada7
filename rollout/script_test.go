package rollout_test

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
	"github.com/meshfold/meshfold/rollout"
)

// TestScripts runs the datadriven scripts of testdata/: each command
// appends an event to a simulated stream of one fleet (its rollout events
// and its nodes' events in one order) and folds it; the output shows the
// event and the effects. The harness is the controller and the server:
// a want effect is appended to the node's want subject when the node's
// newest want is the one it expects (else the server refuses it), then
// its outcome (published or refused) is appended; records are appended
// and folded back. Event N of the stream happens one second after event
// N-1; "tick after=D" lets D pass first.
//
// Rewrite the expectations with: go test ./rollout -run TestScripts -rewrite
func TestScripts(t *testing.T) {
	scripts, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no scripts in testdata: %v", err)
	}
	for _, path := range scripts {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			h := newHarness("web")
			datadriven.RunTestAny(t, path, func(t testing.TB, d *datadriven.TestData) string {
				return h.run(t, d)
			})
		})
	}
}

// tb is what the harness needs of *testing.T and *rapid.T.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

// base is the scripts' clock at event 0.
var base = time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)

type harness struct {
	state  *rollout.State
	now    time.Time
	stream []rollout.Input
	// wants holds every want on the stream by sequence; newest the newest
	// want's sequence per node.
	wants  map[uint64][]events.WantModule
	newest map[string]uint64
	// newestID is the message id of each node's newest want.
	newestID map[string]string
	// unverified, when set, marks the next plan the harness appends as
	// one the controller cannot verify, and why.
	unverified string
	plans      map[string]uint64 // newest plan per node
	// stall, when set, keeps the controller from carrying out wants.
	stall bool
	// lag, when set, holds each want's outcome (published or refused)
	// in outcomes until an "outcomes" command: the reconciler may plan
	// the want before the controller records it published.
	lag      bool
	outcomes []rollout.Input
	held     []rollout.Effect
	quiet    bool   // records are folded without being printed
	note     string // printed after the next event's summary
	out      *strings.Builder
	effect   []rollout.Effect // every effect, in order (for the properties)
}

func newHarness(fleet string) *harness {
	return &harness{state: rollout.NewState(fleet), now: base, wants: map[uint64][]events.WantModule{},
		newest: map[string]uint64{}, newestID: map[string]string{}, plans: map[string]uint64{}, out: new(strings.Builder)}
}

func (h *harness) run(t testing.TB, d *datadriven.TestData) string {
	h.out = new(strings.Builder)
	args := map[string]string{}
	for _, a := range d.CmdArgs {
		args[a.Key] = strings.Join(a.Vals, ",")
	}
	by := orDefault(args["by"], "ops")
	switch d.Cmd {
	case "nodes":
		// Each node gets a want of its own, by hand, before any rollout.
		for _, a := range d.CmdArgs {
			h.addWant(t, a.Key, wantLines(t, d.Input), "")
		}
	case "hand-want":
		// id= gives the want a message id (a rollout step's, published
		// by a controller other than this fold).
		note := "by hand"
		if args["id"] != "" {
			note = "id " + args["id"]
		}
		h.addWantID(t, args["node"], wantLines(t, d.Input), note, args["id"])
	case "aged":
		// The node's wants aged out of the stream (serve --max-age):
		// its want subject holds none, as the server sees it for a
		// want's expected last subject sequence.
		delete(h.newest, args["node"])
		delete(h.newestID, args["node"])
		return "ok"
	case "drop":
		// The stream's limits dropped want #seq, an older want than
		// the node's newest (serve --max-age shorter than a rollout):
		// a revert that copies it cannot read it (carry).
		delete(h.wants, reconciletest.U64(t, args["seq"]))
		return "ok"
	case "refold":
		// The controller restarts and refolds the stream from the start
		// into a new state (the effects decided meanwhile are dropped:
		// "carry" then publishes what it says is pending). drop=plans
		// leaves every plan out, as the controller's feed did before
		// it gave the plans it cannot verify to the fold (a signing key
		// changed with no retired key kept: not its own); unverified=KEY
		// gives every plan folded so far as one signed by KEY that the
		// controller cannot verify (rollout.Input.Unverified), as its
		// feed does now. records=append appends the records the refold
		// decided after the newest record on the subject, as the
		// controller does.
		s := rollout.NewState(h.state.Fleet)
		dropped, lastRecord := 0, uint64(0)
		var decided []rollout.Effect
		for _, in := range h.stream {
			if args["drop"] == "plans" && in.Kind == rollout.KindPlan {
				dropped++
				continue
			}
			if in.Kind == rollout.KindPlan && args["unverified"] != "" {
				in.Unverified = "effect signed by an untrusted key: " + args["unverified"]
			}
			if rec, ok := in.Payload.(*rollout.Record); ok {
				lastRecord = rec.Cause
			}
			for _, e := range s.Fold(in) {
				if e.Record != nil {
					decided = append(decided, e)
				}
			}
		}
		if err := s.CheckInvariants(); err != nil {
			t.Fatalf("%s: refold: invariant broken: %v", d.Pos, err)
		}
		h.state = s
		fmt.Fprintf(h.out, "refolded #1 to #%d (%d plans left out): rollout %d %s, %d wants pending\n",
			len(h.stream), dropped, s.Rollout.ID, s.Rollout.Phase, len(s.Pending()))
		if args["records"] == "append" {
			if e, ok := s.UnrecordedPause(lastRecord); ok {
				decided = append(decided, e)
			}
			for _, e := range decided {
				if e.Record.Cause > lastRecord {
					seq := h.append(t, rollout.Input{Kind: rollout.KindRecord, Payload: e.Record})
					fmt.Fprintf(h.out, "  #%d %s\n", seq, formatEffect(e))
				}
			}
		}
	case "start":
		h.start(t, d, args)
	case "page":
		p := &rollout.Nodes{Rollout: reconciletest.U64(t, args["rollout"]), Page: int(reconciletest.U64(t, args["page"]))}
		for _, l := range reconciletest.Lines(d.Input) {
			p.Nodes = append(p.Nodes, h.nodeLine(t, l))
		}
		h.append(t, rollout.Input{Kind: rollout.KindNodes, Payload: p})
	case "plan":
		// unverified=KEY: a plan signed by KEY, which the controller
		// cannot verify (a forgery, or the reconciler's old key).
		for _, node := range strings.Split(args["node"], ",") {
			if args["unverified"] != "" {
				h.unverified = "effect signed by an untrusted key: " + args["unverified"]
				h.note = " (unverified: " + args["unverified"] + ")"
			}
			h.plan(t, node, args["held"])
			h.unverified = ""
		}
	case "settle":
		for _, node := range strings.Split(args["node"], ",") {
			plan := h.plans[node]
			if args["plan"] != "" {
				plan = reconciletest.U64(t, args["plan"])
			}
			h.node(t, node, rollout.KindSettle, &events.Settle{Module: args["module"], Op: events.SettleOp(orDefault(args["op"], "apply")), Plan: plan, Error: args["error"],
				Untrusted: args["untrusted"] == "true"})
		}
	case "have":
		for _, node := range strings.Split(args["node"], ",") {
			h.node(t, node, rollout.KindHave, haveOf(t, d.Input))
		}
	case "converge":
		// plan, settle and a have with every module of the node's newest
		// want running (health= gives their health).
		for _, node := range strings.Split(args["node"], ",") {
			h.plan(t, node, "")
			h.node(t, node, rollout.KindSettle, &events.Settle{Op: events.OpApply, Plan: h.plans[node]})
			hv := &rollout.Have{}
			for _, m := range h.wants[h.newest[node]] {
				hv.Modules = append(hv.Modules, rollout.HaveModule{Name: m.Name, Build: m.Build, State: events.Running, Health: rollout.Health(args["health"])})
			}
			h.node(t, node, rollout.KindHave, hv)
		}
	case "down", "up":
		for _, node := range strings.Split(args["node"], ",") {
			h.node(t, node, rollout.Kind(d.Cmd), nil)
		}
	case "filled":
		// The node wrote a filled file of its settled plan.
		h.node(t, args["node"], rollout.KindFilled, &events.Filled{Module: args["module"], Path: args["path"], Plan: h.plans[args["node"]], Digest: "d"})
	case "prov-down":
		h.node(t, args["node"], rollout.KindProvDown, nil)
	case "prov-up":
		h.node(t, args["node"], rollout.KindProvUp, nil)
	case "node-pause":
		h.node(t, args["node"], rollout.KindNodePause, &events.Pause{By: by, Reason: args["reason"]})
	case "node-resume":
		h.node(t, args["node"], rollout.KindNodeResume, nil)
	case "node-retire":
		h.node(t, args["node"], rollout.KindNodeRetire, &events.Retire{By: by, Reason: args["reason"]})
	case "tick":
		if args["after"] != "" {
			dur, err := time.ParseDuration(args["after"])
			if err != nil {
				t.Fatalf("%s: %v", d.Pos, err)
			}
			h.now = h.now.Add(dur - time.Second)
		}
		h.append(t, rollout.Input{Kind: rollout.KindTick, Payload: &rollout.Tick{}})
	case "promote", "pause", "resume", "abort", "revert":
		id := reconciletest.U64(t, args["rollout"])
		h.append(t, rollout.Input{Kind: rollout.Kind(d.Cmd), Payload: rollout.NewOperator(rollout.Kind(d.Cmd), id, by, args["reason"])})
	case "raw":
		k := rollout.Kind(args["kind"])
		in := rollout.FromRolloutEvent(k, []byte(strings.TrimSpace(d.Input)), 0, time.Time{})
		h.append(t, in)
	case "stall":
		h.stall = true
		return "ok"
	case "carry":
		if node := args["node"]; node != "" {
			// One node's pending wants carried out, the others still
			// held (its publish answered, theirs not yet).
			for _, e := range h.state.Pending() {
				if e.Want != nil && e.Want.Node == node {
					fmt.Fprintf(h.out, "pending %s\n", formatEffect(e))
					h.carry(t, e)
				}
			}
			break
		}
		// The controller restarts: it publishes what the state says is
		// pending.
		h.stall = false
		h.held = nil
		for _, e := range h.state.Pending() {
			fmt.Fprintf(h.out, "pending %s\n", formatEffect(e))
			h.carry(t, e)
		}
	case "carry-held":
		// The wants the controller decided while stalled reach the
		// server now, in the order decided, whatever the fold folded
		// since (a superseded rollout's step in flight when a new
		// start was stored).
		held := h.held
		h.stall, h.held = false, nil
		for _, e := range held {
			fmt.Fprintf(h.out, "held %s\n", formatEffect(e))
			h.carry(t, e)
		}
	case "lag":
		h.lag = args["on"] != "false"
		return "ok"
	case "outcomes":
		held := h.outcomes
		h.outcomes = nil
		for _, in := range held {
			h.append(t, in)
		}
	case "quiet":
		h.quiet = args["on"] != "false"
		return "ok"
	case "view":
		return formatView(h.state.View())
	case "budget":
		// The budget line `rollout status` and the console print.
		return "budget: " + h.state.View().Budget()
	case "counts":
		// What the budget is of: the fleet's nodes (those no other
		// fleet took over) and how many are unavailable.
		v := h.state.View()
		return fmt.Sprintf("nodes=%d unavailable=%d/%d", v.Nodes, v.Unavailable, v.Params.MaxUnavailable)
	case "moved-by":
		// The caller read who applied the take-over from the other
		// fleet's rollout start (rollout.State.SetMovedBy).
		h.state.SetMovedBy(args["node"], args["by"])
		return "ok"
	case "why":
		lines, ok := h.state.Why(args["node"])
		if !ok {
			return "not in the rollout"
		}
		return strings.Join(lines, "\n")
	case "verb-says":
		// What `meshfold rollout VERB` would say: refused (ignored), or
		// taken with a note (defers), or nothing.
		k := rollout.Kind(args["kind"])
		if why := h.state.Ignores(k, 0); why != "" {
			return "refused: " + why
		}
		if note := h.state.Defers(k, 0); note != "" {
			return "note: " + note
		}
		return "taken"
	case "hand-want-says":
		// What `meshfold want` would refuse on node without --force.
		if why := h.state.HandWant(args["node"]); why != "" {
			return why
		}
		return "nothing"
	case "gives-back":
		var b strings.Builder
		for _, n := range h.state.GivesBack() {
			fmt.Fprintf(&b, "%s prev=#%d", n.Name, n.Prev)
			if n.Base != 0 {
				fmt.Fprintf(&b, " back=#%d", n.Base)
			}
			if n.HadSeq != 0 {
				fmt.Fprintf(&b, " had=#%d (carried)", n.HadSeq)
			}
			b.WriteString("\n")
		}
		if b.Len() == 0 {
			return "none"
		}
		return b.String()
	case "wake":
		w, ok := h.state.NextWake()
		if !ok {
			return "none"
		}
		return "next wake at +" + w.Sub(base).String()
	default:
		t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	}
	return h.out.String()
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// wantLines reads want module lines, as the reconcile scripts write them.
func wantLines(t testing.TB, input string) []events.WantModule {
	ms := []events.WantModule{}
	for _, l := range reconciletest.Lines(input) {
		ms = append(ms, reconciletest.WantModule(t, l))
	}
	return ms
}

// haveOf reads have lines "NAME BUILD STATE [starting|healthy|unhealthy]
// [restarts=N] [exit=X]".
func haveOf(t testing.TB, input string) *rollout.Have {
	hv := &rollout.Have{}
	for _, l := range reconciletest.Lines(input) {
		f := strings.Fields(l)
		if len(f) < 3 {
			t.Fatalf("have line wants NAME BUILD STATE: %q", l)
		}
		m := rollout.HaveModule{Name: f[0], Build: strings.Trim(f[1], "-"), State: events.RunState(f[2])}
		for _, o := range f[3:] {
			k, v, _ := strings.Cut(o, "=")
			switch k {
			case "starting", "healthy", "unhealthy":
				m.Health = rollout.Health(k)
			case "restarts":
				m.Restarts, _ = strconv.Atoi(v)
			case "exit":
				m.Exit = v
			default:
				t.Fatalf("unknown have option %q", o)
			}
		}
		hv.Modules = append(hv.Modules, m)
	}
	return hv
}

func (h *harness) addWant(t tb, node string, ms []events.WantModule, note string) {
	h.addWantID(t, node, ms, note, "")
}

// addWantID appends a want of node under message id id.
func (h *harness) addWantID(t tb, node string, ms []events.WantModule, note, id string) {
	if note != "" {
		h.note = " (" + note + ")"
	}
	seq := h.append(t, rollout.Input{Node: node, Kind: rollout.KindWant, ID: id})
	h.wants[seq], h.newest[node], h.newestID[node] = ms, seq, id
}

// start reads "want: NAME BUILD ...; NAME BUILD" lines (the distinct
// wants, numbered from 1) and "node NAME WANT [down] [unhealthy=M,M]"
// lines (WANT 0: not a target); prev is the node's newest want.
func (h *harness) start(t testing.TB, d *datadriven.TestData, args map[string]string) {
	// supersedes=N: the fleet's newest start as apply read it
	// (rollout.Start.Supersedes; an older apply's start has none).
	p := &rollout.Start{By: orDefault(args["by"], "ops"), Pages: 1}
	if args["supersedes"] != "" {
		p.Supersedes = reconciletest.U64(t, args["supersedes"])
	}
	if args["pages"] != "" {
		p.Pages, _ = strconv.Atoi(args["pages"])
	}
	var err error
	amount := func(k string) rollout.Amount {
		if args[k] == "" {
			return rollout.Amount{}
		}
		a, e := rollout.ParseAmount(args[k])
		if e != nil {
			err = e
		}
		return a
	}
	dur := func(k string) rollout.Duration {
		if args[k] == "" {
			return 0
		}
		v, e := time.ParseDuration(args[k])
		if e != nil {
			err = e
		}
		return rollout.Duration(v)
	}
	p.Params = rollout.Params{Batch: amount("batch"), MaxUnavailable: amount("max_unavailable"), Canary: amount("canary"),
		HealthyDeadline: dur("healthy_deadline"), AutoRevert: args["auto_revert"] == "true"}
	if args["min_healthy"] != "" {
		p.Params.MinHealthy = dur("min_healthy").Ptr()
	}
	if err != nil {
		t.Fatalf("%s: %v", d.Pos, err)
	}
	for _, l := range reconciletest.Lines(d.Input) {
		if w, ok := strings.CutPrefix(l, "want:"); ok {
			ms := []events.WantModule{}
			if strings.TrimSpace(w) == "(none)" {
				// A want of no module.
				p.Wants = append(p.Wants, ms)
				continue
			}
			for _, m := range strings.Split(w, ";") {
				ms = append(ms, reconciletest.WantModule(t, strings.TrimSpace(m)))
			}
			p.Wants = append(p.Wants, ms)
			continue
		}
		p.Nodes = append(p.Nodes, h.nodeLine(t, l))
	}
	// As apply does: each target's files its new want adds.
	for i, n := range p.Nodes {
		if n.Want == 0 || n.Want > len(p.Wants) {
			continue
		}
		current := h.wants[h.newest[n.Node]]
		if n.Had > 0 && n.Had <= len(p.Wants) {
			current = p.Wants[n.Had-1] // as apply: the want the reconciler's state held
		}
		fresh := rollout.NewFiles(current, p.Wants[n.Want-1])
		if len(fresh) == 0 {
			continue
		}
		j := slices.IndexFunc(p.NewFiles, func(l []rollout.FileRef) bool { return slices.Equal(l, fresh) })
		if j < 0 {
			j = len(p.NewFiles)
			p.NewFiles = append(p.NewFiles, fresh)
		}
		p.Nodes[i].NewFiles = j + 1
	}
	if args["bases"] == "true" {
		// As apply does over the fleet's newest rollout, still active:
		// each target's revert base (State.RevertBases).
		cands := make([]rollout.Candidate, len(p.Nodes))
		for i, n := range p.Nodes {
			cands[i] = rollout.Candidate{Node: n.Node, Prev: n.Prev}
		}
		h.state.RevertBases(cands)
		for i := range p.Nodes {
			if p.Nodes[i].Want > 0 {
				p.Nodes[i].Back = cands[i].Back
				if c := cands[i]; c.HadSeq != 0 && c.Back == 0 {
					// The want the superseded rollout carried, carried
					// on (rollout.NewStart adds it to the wants).
					j := slices.IndexFunc(p.Wants, func(w []events.WantModule) bool { return rollout.EqualWant(w, c.Had) })
					if j < 0 {
						j = len(p.Wants)
						p.Wants = append(p.Wants, c.Had)
					}
					p.Nodes[i].Had, p.Nodes[i].HadSeq = j+1, c.HadSeq
				}
			}
		}
	}
	if args["carry"] == "true" {
		// As apply does (rollout.NewStart): each target's want before
		// the rollout carried in the start, so that a revert does not
		// copy it from the stream.
		rollout.CarryBefore(p, nil, func(node string) ([]events.WantModule, bool) {
			w, ok := h.wants[h.newest[node]]
			return w, ok
		})
	}
	if err := rollout.Stamp(p, h.now).Validate(); err != nil {
		t.Fatalf("%s: start: %v", d.Pos, err)
	}
	h.append(t, rollout.Input{Kind: rollout.KindStart, Payload: p})
}

// nodeLine reads "node NAME WANT [down|down-since=+D] [paused=BY:REASON]
// [unhealthy=M,M] [had=K:SEQ]".
func (h *harness) nodeLine(t tb, l string) rollout.NodeAtStart {
	f := strings.Fields(l)
	if len(f) < 3 || f[0] != "node" {
		t.Fatalf("start line wants 'want: …' or 'node NAME WANT [down] [unhealthy=M]': %q", l)
	}
	w, _ := strconv.Atoi(f[2])
	n := rollout.NodeAtStart{Node: f[1], Want: w, Prev: h.newest[f[1]]}
	for _, o := range f[3:] {
		if o == "down" {
			n.Down = true
		} else if v, ok := strings.CutPrefix(o, "down-since=+"); ok {
			// Down since base+D, as apply read its agent's down event.
			d, err := time.ParseDuration(v)
			if err != nil {
				t.Fatalf("down-since: %v", err)
			}
			n.Down, n.DownSince = true, base.Add(d)
		} else if v, ok := strings.CutPrefix(o, "paused="); ok {
			n.PausedBy, n.PausedReason, _ = strings.Cut(v, ":")
		} else if v, ok := strings.CutPrefix(o, "unhealthy="); ok {
			n.Unhealthy = strings.Split(v, ",")
		} else if v, ok := strings.CutPrefix(o, "restarts="); ok {
			// restarts=MODULE:BUILD:N,…: as apply read its newest have.
			for _, r := range strings.Split(v, ",") {
				p := strings.Split(r, ":")
				k, _ := strconv.Atoi(p[2])
				n.Restarts = append(n.Restarts, rollout.ModuleRestarts{Module: p[0], Build: p[1], Restarts: k})
			}
		} else if v, ok := strings.CutPrefix(o, "read=#"); ok {
			// read=#SEQ: apply read want SEQ as the node's newest, an
			// older one than the stream's newest now.
			n.Prev, _ = strconv.ParseUint(v, 10, 64)
		} else if v, ok := strings.CutPrefix(o, "had="); ok {
			// had=K:SEQ: the want it had before, K of the start's
			// wants, stored at SEQ, which the stream no longer holds
			// (apply read it from the reconciler's state).
			k, seq, _ := strings.Cut(v, ":")
			n.Had, _ = strconv.Atoi(k)
			n.HadSeq, _ = strconv.ParseUint(seq, 10, 64)
		}
	}
	return n
}

func (h *harness) plan(t tb, node, held string) {
	want := h.newest[node]
	p := &events.Plan{Cause: want, Want: want}
	for _, m := range h.wants[want] {
		row := events.PlanModule{Name: m.Name, Build: m.Build, RunsAs: m.RunsAs, Files: m.Files, Provisioner: m.Provisioner}
		if m.Provisioner {
			p.ProvisionerAccount = m.RunsAs
		}
		if slices.Contains(strings.Split(held, ","), m.Name) {
			row = events.PlanModule{Name: m.Name, Held: true, Why: events.HoldApproval, Pending: m.Build}
		}
		p.Modules = append(p.Modules, row)
	}
	h.plans[node] = h.append(t, rollout.Input{Node: node, Kind: rollout.KindPlan, Payload: p, Unverified: h.unverified})
}

func (h *harness) node(t tb, node string, k rollout.Kind, p any) uint64 {
	return h.append(t, rollout.Input{Node: node, Kind: k, Payload: p})
}

// append puts in on the stream at the next sequence, folds it and
// carries out its effects.
func (h *harness) append(t tb, in rollout.Input) uint64 {
	h.now = h.now.Add(time.Second)
	in.Seq, in.Time = uint64(len(h.stream)+1), h.now
	h.stream = append(h.stream, in)
	if in.Kind != rollout.KindRecord {
		fmt.Fprintf(h.out, "#%d %s%s\n", in.Seq, summary(in), h.note)
		h.note = ""
	}
	effs := h.state.Fold(in)
	if err := h.state.CheckInvariants(); err != nil {
		t.Fatalf("after #%d: invariant broken: %v", in.Seq, err)
	}
	h.effect = append(h.effect, effs...)
	for _, e := range effs {
		if e.Record != nil {
			seq := h.append(t, rollout.Input{Kind: rollout.KindRecord, Payload: e.Record})
			if !h.quiet {
				fmt.Fprintf(h.out, "  #%d %s\n", seq, formatEffect(e))
			}
			continue
		}
		fmt.Fprintf(h.out, "  %s\n", formatEffect(e))
		if h.stall {
			h.held = append(h.held, e)
			continue
		}
		h.carry(t, e)
	}
	return in.Seq
}

// carry publishes a want as the server would: only when the node's
// newest want is the one expected; then records the outcome.
func (h *harness) carry(t tb, e rollout.Effect) {
	w := e.Want
	if last := h.newest[w.Node]; last != w.Expect {
		if h.newestID[w.Node] == e.ID() {
			// Stored already by this step (the controller reads the
			// newest want's id on a refusal).
			h.append(t, rollout.Input{Kind: rollout.KindPublished, Payload: &rollout.Published{Rollout: w.Rollout, Node: w.Node, Step: w.Step, Want: last}})
			return
		}
		// The controller reads the newest want back: its sequence and
		// its message id (a rollout step's names its writer).
		h.append(t, rollout.Input{Kind: rollout.KindRefused, Payload: &rollout.Refused{Rollout: w.Rollout, Node: w.Node, Step: w.Step, Last: last, LastID: h.newestID[w.Node]}})
		return
	}
	ms := w.Modules
	if ms == nil {
		var ok bool
		if ms, ok = h.wants[w.CopyOf]; !ok && w.CopyOf != 0 {
			// Dropped by the stream's limits ("drop"): the controller
			// cannot read it and records the step refused.
			h.append(t, rollout.Input{Kind: rollout.KindRefused, Payload: &rollout.Refused{Rollout: w.Rollout, Node: w.Node, Step: w.Step,
				Error: fmt.Sprintf("the previous want #%d could not be read: it is gone from the stream (its --max-age or --max-bytes dropped it) "+
					"and the rollout's start does not carry it; give the node its want by hand ('meshfold want %s -f FILE')", w.CopyOf, w.Node)}})
			return
		}
	}
	seq := h.append(t, rollout.Input{Node: w.Node, Kind: rollout.KindWant, ID: e.ID()})
	h.wants[seq], h.newest[w.Node], h.newestID[w.Node] = ms, seq, e.ID()
	out := rollout.Input{Kind: rollout.KindPublished, Payload: &rollout.Published{Rollout: w.Rollout, Node: w.Node, Step: w.Step, Want: seq}}
	if h.lag {
		h.outcomes = append(h.outcomes, out)
		return
	}
	h.append(t, out)
}

func summary(in rollout.Input) string {
	if in.Err != nil {
		return fmt.Sprintf("%s (not decoded: %v)", in.Kind, in.Err)
	}
	switch p := in.Payload.(type) {
	case *rollout.Start:
		return fmt.Sprintf("start by %s: %d wants, %d nodes, %d pages", p.By, len(p.Wants), len(p.Nodes), p.Pages)
	case *rollout.Nodes:
		return fmt.Sprintf("nodes of rollout %d page %d: %d nodes", p.Rollout, p.Page, len(p.Nodes))
	case *rollout.Published:
		return fmt.Sprintf("published %s %s want=#%d", p.Node, p.Step, p.Want)
	case *rollout.Refused:
		if p.Error != "" {
			return fmt.Sprintf("refused %s %s last=#%d: %s", p.Node, p.Step, p.Last, p.Error)
		}
		if p.LastID != "" {
			return fmt.Sprintf("refused %s %s last=#%d (id %s)", p.Node, p.Step, p.Last, p.LastID)
		}
		return fmt.Sprintf("refused %s %s last=#%d", p.Node, p.Step, p.Last)
	case *rollout.Operator:
		return fmt.Sprintf("%s by %s", p.Kind(), p.By)
	case *rollout.Tick:
		return fmt.Sprintf("tick at +%s", in.Time.Sub(base))
	case *rollout.Record:
		return fmt.Sprintf("record %s", p.What)
	case *events.Plan:
		var rows []string
		for _, m := range p.Modules {
			if m.Held {
				rows = append(rows, m.Name+":held("+string(m.Why)+")")
			} else {
				rows = append(rows, m.Name+":"+m.Build)
			}
		}
		return fmt.Sprintf("plan %s want=#%d %s", in.Node, p.Want, strings.Join(rows, ","))
	case *events.Settle:
		return fmt.Sprintf("settle %s plan=#%d %s", in.Node, p.Plan, p.Op)
	case *events.Filled:
		return fmt.Sprintf("filled %s %s %s plan=#%d", in.Node, p.Module, p.Path, p.Plan)
	case *rollout.Have:
		var ms []string
		for _, m := range p.Modules {
			s := m.Name + ":" + m.Build + ":" + string(m.State)
			if m.Health != "" {
				s += ":" + string(m.Health)
			}
			if m.Restarts > 0 {
				s += fmt.Sprintf(":restarts=%d", m.Restarts)
			}
			ms = append(ms, s)
		}
		return fmt.Sprintf("have %s %s", in.Node, strings.Join(ms, ","))
	}
	if in.Node != "" {
		return fmt.Sprintf("%s %s", in.Kind, in.Node)
	}
	return string(in.Kind)
}

func formatEffect(e rollout.Effect) string {
	if r := e.Record; r != nil {
		lvl := ""
		if r.Level != events.LevelInfo {
			lvl = " [" + string(r.Level) + "]"
		}
		return fmt.Sprintf("record %s%s: %s", r.What, lvl, r.Msg)
	}
	w := e.Want
	var ms []string
	for _, m := range w.Modules {
		ms = append(ms, m.Name+":"+m.Build)
	}
	s := fmt.Sprintf("want %s %s expect=#%d", w.Node, w.Step, w.Expect)
	if w.Modules == nil {
		s += fmt.Sprintf(" copy-of=#%d", w.CopyOf)
	} else {
		s += " modules=" + strings.Join(ms, ",")
	}
	return s + " id=" + e.ID()
}

func formatView(v rollout.View) string {
	var b strings.Builder
	fmt.Fprintf(&b, "rollout %d %s batch %d/%d unavailable %d/%d", v.Rollout, v.Phase, v.Batch, v.Batches, v.Unavailable, v.Params.MaxUnavailable)
	if v.AwaitTurn > 0 {
		fmt.Fprintf(&b, " not-counted %d", v.AwaitTurn)
	}
	if v.Paused != nil {
		fmt.Fprintf(&b, " paused-by=%s", v.Paused.By)
	}
	if v.Promoted {
		b.WriteString(" promoted")
	}
	b.WriteString("\n")
	if v.Stalled != "" {
		fmt.Fprintf(&b, "  stalled: %s\n", v.Stalled)
	}
	if v.PromoteNote != "" {
		fmt.Fprintf(&b, "  promote-note: %s\n", v.PromoteNote)
	}
	for _, t := range v.Targets {
		fmt.Fprintf(&b, "  %s batch=%d %s", t.Node, t.Batch, t.Status)
		if t.Published > 0 {
			fmt.Fprintf(&b, " want=#%d", t.Published)
		}
		if t.Plan > 0 {
			fmt.Fprintf(&b, " plan=#%d settled=%v", t.Plan, t.Settled)
		}
		var run []string
		for _, m := range t.Running {
			s := m.Module + ":" + m.Build
			if m.Health != "" {
				s += ":" + string(m.Health)
			}
			run = append(run, s)
		}
		if len(run) > 0 {
			fmt.Fprintf(&b, " running=%s", strings.Join(run, ","))
		}
		if !t.HealthySince.IsZero() {
			fmt.Fprintf(&b, " healthy-since=+%s", t.HealthySince.Sub(base))
		}
		if t.Paused != nil {
			b.WriteString(" paused")
		}
		if t.Down {
			b.WriteString(" down")
		}
		if t.Revert != nil {
			fmt.Fprintf(&b, " revert=%s", t.Revert.Status)
		}
		if t.Arrived {
			b.WriteString(" arrived")
		}
		if t.RunsNothing {
			b.WriteString(" runs-nothing")
		}
		if t.Why != "" {
			fmt.Fprintf(&b, " why=%q", t.Why)
		}
		b.WriteString("\n")
	}
	for _, c := range v.Builds {
		fmt.Fprintf(&b, "  build %s %s on %d nodes", c.Module, c.Build, c.Nodes)
		for _, st := range slices.Sorted(maps.Keys(c.NotRunning)) {
			fmt.Fprintf(&b, " %s=%d", st, c.NotRunning[st])
		}
		b.WriteString("\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}
