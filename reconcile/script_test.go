package reconcile_test

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
)

// TestScripts runs the datadriven scripts of testdata/: each input
// command (reconciletest.Script) appends an event to a simulated stream of
// one node (reconciletest.Stream) and folds it; the output shows the event
// and the effects the fold returned, each at the sequence it takes on the
// stream (plans are folded at once, as the reconciler reads its own plan
// events). "node name=X" starts a new stream of node X. The query
// commands print: state, dry-run, stuck at=SECONDS, runtime at=SECONDS,
// judge, refold seq=N;
// "hold" keeps the plans emitted next out of the stream until "release
// [n=N]" appends them (a reconciler that reads its plans back late).
//
// Rewrite the expectations with: go test ./reconcile -run TestScripts -rewrite
func TestScripts(t *testing.T) {
	scripts, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no scripts in testdata: %v", err)
	}
	for _, path := range scripts {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			h := newHarness(t, "ace")
			datadriven.RunTestAny(t, path, func(t testing.TB, d *datadriven.TestData) string {
				return h.run(t, d)
			})
		})
	}
}

// base is the scripts' clock: event N happens at base + N seconds.
var base = time.Date(2026, 11, 3, 20, 50, 0, 0, time.UTC)

// harness is the scripts' one node on its stream.
type harness struct {
	reconciletest.Script
	t testing.TB // the test running the current command
}

// newHarness returns node's empty stream, which checks the state's
// invariants after every fold.
func newHarness(t testing.TB, node string) *harness {
	h := &harness{t: t}
	h.Stream = reconciletest.New(base, time.Second)
	h.Stream.PlansOnly = true // the states printed never folded a knock or journal
	h.Node = node
	h.Stream.Live = func(ev events.Event, st *reconcile.State) {
		if err := st.CheckInvariants(); err != nil {
			h.t.Fatalf("after #%d %s: invariant broken: %v\n%s", ev.Seq, ev.Kind, err, formatState(st))
		}
	}
	return h
}

func (h *harness) state() *reconcile.State { return h.Stream.State(h.Node) }

func (h *harness) run(t testing.TB, d *datadriven.TestData) string {
	h.t = t
	if ev, ok := h.Input(t, d); ok {
		var out strings.Builder
		fmt.Fprintf(&out, "#%d %s\n", ev.Seq, summary(ev))
		h.effects(&out, ev.Seq)
		return out.String()
	}
	args := map[string]string{}
	for _, a := range d.CmdArgs {
		args[a.Key] = strings.Join(a.Vals, ",")
	}
	switch d.Cmd {
	case "node":
		*h = *newHarness(t, args["name"])
		return "ok"
	case "hold":
		// Plans the fold emits from now on stay out of the stream until
		// "release": the reconciler reads them back after later events.
		h.Stream.HoldPlans = true
		return "ok"
	case "release":
		// Appends the held plans (the first n=N of them), in order, each
		// folded as it lands; holding ends once none is left.
		n := h.Stream.Held()
		if args["n"] != "" {
			n = int(reconciletest.U64(t, args["n"]))
		}
		var out strings.Builder
		for _, ev := range h.Stream.Release(n) {
			fmt.Fprintf(&out, "#%d plan cause=%d\n", ev.Seq, ev.Payload.(*events.Plan).Cause)
			h.effects(&out, ev.Seq)
		}
		if h.Stream.Held() == 0 {
			h.Stream.HoldPlans = false
		}
		return out.String()
	case "refold":
		seq := reconciletest.U64(t, args["seq"])
		ev, ok := h.Stream.Event(seq)
		if !ok {
			t.Fatalf("%s: no event #%d", d.Pos, seq)
		}
		effs := h.state().Fold(ev)
		if err := h.state().CheckInvariants(); err != nil {
			t.Fatalf("%s: invariant broken: %v", d.Pos, err)
		}
		return fmt.Sprintf("refold #%d: %d effects\n", seq, len(effs))
	case "dry-run":
		var ms []events.WantModule
		for _, line := range reconciletest.Lines(d.Input) {
			ms = append(ms, reconciletest.WantModule(t, line))
		}
		before := formatState(h.state())
		out := formatDryRun(h.state().DryRun(ms))
		if after := formatState(h.state()); after != before {
			t.Fatalf("%s: the dry run changed the state:\n%s\n%s", d.Pos, before, after)
		}
		return out
	case "stuck":
		// What is stuck, N seconds after the scripts' base time.
		now := base.Add(time.Duration(reconciletest.U64(t, args["at"])) * time.Second)
		return formatStuck(h.state().View().Stuck(now))
	case "runtime":
		// Each module of the newest have as fleet judges it N seconds
		// after the scripts' base time: flapping, or flapped and settled;
		// its health and the event since which it says it.
		now := base.Add(time.Duration(reconciletest.U64(t, args["at"])) * time.Second)
		var b strings.Builder
		for _, r := range reconcile.RuntimeOf(h.state()) {
			fmt.Fprintf(&b, "%s %s %s crashes=%d", r.Module, r.Build, r.State, len(r.Crashes))
			if r.Health != "" {
				fmt.Fprintf(&b, " %s", r.Health)
				if r.HealthSince != nil {
					fmt.Fprintf(&b, " since #%d", r.HealthSince.Sub(base)/time.Second)
				}
			}
			if r.Flapping(now) {
				b.WriteString(" flapping")
			}
			if last, ok := r.FlapSettled(now); ok {
				fmt.Fprintf(&b, " settled (last crash #%d)", last.Sub(base)/time.Second)
			}
			b.WriteString("\n")
		}
		return b.String()
	case "flood":
		return h.flood(t, d, args)
	case "restart":
		// The node's state as a restarted reconciler holds it: encoded
		// as a snapshot and decoded (what the state keeps only in
		// memory, the noisy rule's window, is gone).
		snap, err := reconcile.MarshalState(h.state())
		if err != nil {
			t.Fatalf("%s: %v", d.Pos, err)
		}
		back, err := reconcile.UnmarshalState(snap)
		if err != nil {
			t.Fatalf("%s: %v", d.Pos, err)
		}
		*h.state() = *back
		return fmt.Sprintf("restarted from a snapshot at #%d", back.Seq)
	case "state":
		return formatState(h.state())
	case "judge":
		var account string
		var rows []events.PlanModule
		if s := h.state().Settled; s != nil {
			account, rows = s.Account, s.Modules
		}
		f, reason := reconcile.Judge(account, rows, args["module"], args["path"], args["writer"])
		if reason != "" {
			return "refuse " + string(reason)
		}
		return "accept mode=" + string(f.Mode)
	default:
		t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	}
	return ""
}

// flood appends n=N events of the node's own kind=K (have, the default;
// settle; filled) of size=BYTES each (the message's length, as a reader
// of the stream sets it), every=DURATION apart from the last event's
// time, with invalid=true as payloads that do not decode (junk on the
// node's subject). It prints the range, then each event that had
// effects, with them; the clock goes on at a second an event after it.
func (h *harness) flood(t testing.TB, d *datadriven.TestData, args map[string]string) string {
	n := int(reconciletest.U64(t, args["n"]))
	size := 0
	if args["size"] != "" {
		size = int(reconciletest.U64(t, args["size"]))
	}
	every, err := time.ParseDuration(args["every"])
	if err != nil {
		d.Fatalf(t, "flood every=%q: %v", args["every"], err)
	}
	kind := events.Kind(args["kind"])
	if kind == "" {
		kind = events.KindHave
	}
	// The stream's clock: event N at Base + N×Step. Go on from the last
	// event's time at every a step, then at a second a step again.
	s := h.Stream
	rebase := func(step time.Duration) {
		last := s.Next() - 1
		s.Base, s.Step = s.TimeOf(last).Add(-time.Duration(last)*step), step
	}
	rebase(every)
	defer rebase(time.Second)
	var out strings.Builder
	first := s.Next()
	var effects strings.Builder
	for range n {
		ev := events.Event{Node: h.Node, Kind: kind, Size: size}
		switch kind {
		case events.KindHave:
			ev.Payload = &events.Have{Modules: []events.HaveModule{}}
		case events.KindSettle:
			ev.Payload = &events.Settle{Op: events.OpApply, Plan: max(h.state().NewestPlan, 1)}
		case events.KindFilled:
			ev.Payload = &events.Filled{Module: "app", Path: "/run/app/key", Plan: h.state().NewestPlan, Digest: "d"}
		case events.KindRefusal:
			ev.Payload = &events.Refusal{Module: "app", Path: "/run/app/key", Reason: events.ReasonNoAccount, Plan: h.state().NewestPlan, Writer: "prov"}
		default:
			d.Fatalf(t, "flood kind=%q: have, settle, refusal or filled", kind)
		}
		if args["invalid"] == "true" {
			ev.Payload, ev.Err = nil, fmt.Errorf("%w: junk", events.ErrMalformed)
		} else {
			events.Stamp(ev.Payload, s.TimeOf(s.Next()))
		}
		ev = s.AppendEvent(ev)
		if len(s.Effects(ev.Seq)) > 0 {
			fmt.Fprintf(&effects, "#%d %s at +%s\n", ev.Seq, ev.Kind, ev.Time.Sub(s.TimeOf(first-1)))
			h.effects(&effects, ev.Seq)
		}
	}
	fmt.Fprintf(&out, "#%d–#%d %d %s of %d bytes, %s apart\n", first, s.Next()-1, n, kind, size, every)
	out.WriteString(effects.String())
	return out.String()
}

// effects prints the effects of the event at seq, each at the sequence it
// lands at; a plan held (hold) has none yet.
func (h *harness) effects(out *strings.Builder, seq uint64) {
	next := seq + 1
	for _, e := range h.Stream.Effects(seq) {
		if h.Stream.HoldPlans && e.Kind == events.KindPlan {
			fmt.Fprintf(out, "  %s\n", strings.Replace(formatEffect(e, 0), "plan - ", "plan held ", 1))
			continue
		}
		fmt.Fprintf(out, "  %s\n", formatEffect(e, next))
		next++
	}
}

func formatDryRun(d reconcile.DryRun) string {
	var b strings.Builder
	fmt.Fprintf(&b, "dry run at #%d (want #%d): publish=%v account=%s", d.Seq, d.Want, d.Publish, orNone(d.Account))
	if d.Paused != nil {
		fmt.Fprintf(&b, " paused-by=%s", d.Paused.By)
	}
	if d.Returns {
		b.WriteString(" returns-from-retirement")
	}
	for _, m := range d.Modules {
		fmt.Fprintf(&b, "\n  %s", formatRow(m))
	}
	b.WriteString(formatDiff(d.Diff, "  "))
	return b.String()
}

func formatDiff(d reconcile.PlanDiff, indent string) string {
	var b strings.Builder
	if d.AccountFrom != d.AccountTo {
		fmt.Fprintf(&b, "\n%saccount %s -> %s", indent, orNone(d.AccountFrom), orNone(d.AccountTo))
	}
	for _, r := range d.Added {
		fmt.Fprintf(&b, "\n%sadded %s", indent, formatRow(r))
	}
	for _, r := range d.Removed {
		fmt.Fprintf(&b, "\n%sremoved %s", indent, r.Name)
	}
	for _, c := range d.Changed {
		fmt.Fprintf(&b, "\n%schanged %s (%s): %s", indent, c.Module, strings.Join(c.Fields, ","), formatRow(c.To))
	}
	for _, h := range d.Held {
		fmt.Fprintf(&b, "\n%sheld %s why=%s pending=%s", indent, h.Module, h.Why, orNone(h.Pending))
	}
	return b.String()
}

func formatStuck(k reconcile.Stuck) string {
	var b strings.Builder
	if k.Paused != nil {
		fmt.Fprintf(&b, "paused by %s since #%d (%.0fs) withheld=%v\n", k.Paused.By, k.Paused.Seq, k.PausedFor, k.Withheld)
	}
	if k.Retiring {
		b.WriteString("retiring\n")
	}
	if k.Retired {
		b.WriteString("retired\n")
	}
	for _, u := range k.Unfilled {
		fmt.Fprintf(&b, "unfilled %s %s since plan %d (%.0fs)\n", u.Module, u.Path, u.Plan, u.For)
	}
	for _, o := range k.Owed {
		fmt.Fprintf(&b, "owed %s (%.0fs)\n", formatOwed(o.Owed), o.For)
	}
	if !k.Any() {
		b.WriteString("nothing stuck\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func summary(ev events.Event) string {
	if ev.Err != nil {
		return fmt.Sprintf("%s (undecodable)", ev.Kind)
	}
	switch p := ev.Payload.(type) {
	case *events.Want:
		names := make([]string, len(p.Modules))
		for i, m := range p.Modules {
			names[i] = m.Name
		}
		if !p.Gates {
			return "want " + strings.Join(names, " ") + " (an older build's: sets no gate)"
		}
		return "want " + strings.Join(names, " ")
	case *events.Have:
		var parts []string
		for _, m := range p.Modules {
			s := m.Name + "=" + m.Build + "/" + string(m.State)
			if m.Account != "" {
				s += "@" + m.Account
			}
			parts = append(parts, s)
		}
		if p.NoPlan {
			parts = append(parts, "no_plan")
		}
		for _, m := range p.Missing {
			arg := "missing="
			if m.AtStart {
				arg = "at_start="
			}
			parts = append(parts, arg+m.Module+":"+m.Path)
		}
		if p.LookedBefore != 0 {
			parts = append(parts, fmt.Sprintf("looked=%d", p.LookedBefore))
		}
		if p.Started != "" {
			parts = append(parts, "started="+p.Started)
		}
		return "have " + strings.Join(parts, " ")
	case *events.Approve:
		return fmt.Sprintf("approve %s %s by=%s", p.Module, p.Build, p.By)
	case *events.Settle:
		s := fmt.Sprintf("settle plan=%d module=%s op=%s", p.Plan, p.Module, p.Op)
		if p.Error != "" {
			s += " error=" + events.ErrorText(p.Error)
		}
		if p.Untrusted {
			s += " untrusted"
		}
		return s
	case *events.Refusal:
		return fmt.Sprintf("refusal %s %s %s plan=%d writer=%s", p.Module, p.Path, p.Reason, p.Plan, p.Writer)
	case *events.Filled:
		if p.Claim != "" {
			return fmt.Sprintf("filled %s %s plan=%d claim=%s", p.Module, p.Path, p.Plan, p.Claim)
		}
		return fmt.Sprintf("filled %s %s plan=%d", p.Module, p.Path, p.Plan)
	case *events.Pause:
		return fmt.Sprintf("pause by=%s reason=%s", p.By, orNone(p.Reason))
	case *events.Resume:
		return "resume by=" + p.By
	case *events.Poke:
		return "poke by=" + p.By
	case *events.Revoke:
		return fmt.Sprintf("revoke %s %s by=%s", p.Module, p.Build, p.By)
	case *events.Waive:
		return fmt.Sprintf("waive %s %s by=%s", p.Module, p.Path, p.By)
	case *events.Retire:
		return fmt.Sprintf("retire by=%s force=%v", p.By, p.Force)
	case *events.Ack:
		return fmt.Sprintf("ack by=%s upto=%d", p.By, p.Upto)
	case *events.Gate:
		if p.Lift {
			return fmt.Sprintf("gate %s lift by=%s", p.Module, p.By)
		}
		return fmt.Sprintf("gate %s by=%s", p.Module, p.By)
	case *events.Prov:
		s := "prov"
		if p.NoPlan {
			s += " no_plan"
		}
		if p.OldKey {
			s += " old_key"
		}
		if p.LookedBefore != 0 {
			s += fmt.Sprintf(" looked=%d", p.LookedBefore)
		}
		return s
	case *events.Agent:
		s := fmt.Sprintf("agent %s claim=%s", p.State, p.Claim)
		if p.Why != "" {
			s += " why=" + string(p.Why)
		}
		return s
	}
	return string(ev.Kind)
}

func formatEffect(e reconcile.Effect, seq uint64) string {
	where := "#" + strconv.FormatUint(seq, 10)
	if seq == 0 {
		where = "-"
	}
	switch p := e.Payload.(type) {
	case *events.Plan:
		var b strings.Builder
		fmt.Fprintf(&b, "plan %s %s want=%d account=%s", where, e.ID(), p.Want, orNone(p.ProvisionerAccount))
		for _, m := range p.Modules {
			fmt.Fprintf(&b, "\n    %s", formatRow(m))
		}
		return b.String()
	case *events.Knock:
		var b strings.Builder
		rs := make([]string, len(p.Reasons))
		for i, r := range p.Reasons {
			rs[i] = string(r)
		}
		fmt.Fprintf(&b, "knock %s %s reasons=%s", where, e.ID(), strings.Join(rs, ","))
		for _, o := range p.Owed {
			fmt.Fprintf(&b, "\n    owed %s", formatOwed(o))
		}
		return b.String()
	case *events.Journal:
		return fmt.Sprintf("journal %s %s %s: %s", where, e.ID(), p.Level, p.Msg)
	}
	return "?"
}

func formatRow(m events.PlanModule) string {
	s := m.Name + " " + orNone(m.Build)
	if m.Held {
		s = fmt.Sprintf("%s held(%s) carries %s", m.Name, m.Why, orNone(m.Build))
	}
	s += " runs_as=" + orNone(m.RunsAs)
	if len(m.Files) > 0 {
		fs := make([]string, len(m.Files))
		for i, f := range m.Files {
			fs[i] = f.Path + ":" + string(f.Mode)
		}
		s += " files=" + strings.Join(fs, ",")
	}
	if m.Provisioner {
		s += " provisioner"
	}
	if m.Pending != "" {
		s += " pending=" + m.Pending
	}
	return s
}

func formatOwed(o events.Owed) string {
	return fmt.Sprintf("%s %s %s plan=%d writer=%s", o.Module, o.Path, o.Reason, o.Plan, o.Writer)
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func formatState(s *reconcile.State) string {
	var b strings.Builder
	seq := func(r *reconcile.PlanRecord) string {
		if r == nil {
			return "-"
		}
		return strconv.FormatUint(r.Seq, 10)
	}
	want := "-"
	if s.Want != nil {
		want = strconv.FormatUint(s.Want.Seq, 10)
	}
	have := "-"
	if s.Have != nil {
		have = strconv.FormatUint(s.Have.Seq, 10)
	}
	var unsettled []string
	for _, r := range s.Unsettled {
		unsettled = append(unsettled, fmt.Sprintf("%d(cause %d)", r.Seq, r.Cause))
	}
	fmt.Fprintf(&b, "seq=%d want=%s have=%s settled=%s newest_plan=%d unsettled=[%s]\n",
		s.Seq, want, have, seq(s.Settled), s.NewestPlan, strings.Join(unsettled, " "))
	if len(s.Dropped) > 0 {
		fmt.Fprintf(&b, "dropped plans: %v\n", s.Dropped)
	}
	if e := s.Emitted(); e != nil {
		again := ""
		if e.Again {
			again = " again"
		}
		fmt.Fprintf(&b, "emitted: plan %s cause=%d account=%s%s\n", seq(e), e.Cause, orNone(e.Account), again)
	}
	for _, a := range s.Accepting {
		fmt.Fprintf(&b, "accepting: %s %s from %s since plan %d\n", a.Module, a.Path, a.Account, a.Plan)
	}
	for _, f := range s.Filled {
		by := ""
		if f.Claim != "" {
			by = " by " + f.Claim
		}
		fmt.Fprintf(&b, "filled: %s %s at plan %d%s\n", f.Module, f.Path, f.Plan, by)
	}
	for _, a := range s.Approvals {
		fmt.Fprintf(&b, "approval: %s %s by %s (#%d)\n", a.Module, a.Build, a.By, a.Seq)
	}
	for _, g := range s.Gates {
		if g.By == "" {
			fmt.Fprintf(&b, "gate: %s by want #%d\n", g.Module, g.Seq)
		} else {
			fmt.Fprintf(&b, "gate: %s by %s (#%d)\n", g.Module, g.By, g.Seq)
		}
		if g.Dropped != 0 {
			fmt.Fprintf(&b, "gate: %s dropped by want #%d\n", g.Module, g.Dropped)
		}
	}
	if g := s.GatesFull; g != nil {
		fmt.Fprintf(&b, "gates full since #%d: not kept %v, %d unnamed\n", g.Seq, g.Modules, g.Unnamed)
	}
	for _, it := range s.Owed {
		if it.Why != "" {
			fmt.Fprintf(&b, "owed: %s (#%d) why=%q\n", formatOwed(it.Owed), it.Seq, it.Why)
		} else {
			fmt.Fprintf(&b, "owed: %s (#%d)\n", formatOwed(it.Owed), it.Seq)
		}
	}
	if s.AccountJournaled {
		b.WriteString("account transition journaled\n")
	}
	if p := s.Paused; p != nil {
		fmt.Fprintf(&b, "paused: by %s since #%d reason=%s\n", p.By, p.Seq, orNone(p.Reason))
	}
	if r := s.Retire; r != nil {
		state := "retiring"
		if r.Retired {
			state = fmt.Sprintf("retired at #%d", r.RetiredSeq)
		}
		fmt.Fprintf(&b, "retire: %s by %s since #%d force=%v\n", state, r.By, r.Seq, r.Force)
	}
	for _, w := range s.Waivers {
		fmt.Fprintf(&b, "waiver: %s %s through plan %d by %s (#%d)\n", w.Module, w.Path, w.Plan, w.By, w.Seq)
	}
	if a := s.Ack; a != nil {
		fmt.Fprintf(&b, "ack: warnings through #%d acknowledged by %s (#%d)\n", a.Upto, a.By, a.Seq)
	}
	for _, f := range s.Failed {
		fmt.Fprintf(&b, "failed: module=%s plan %d (#%d) error=%q\n", orNone(f.Module), f.Plan, f.Seq, f.Error)
	}
	for _, m := range s.Missing {
		at := ""
		if m.AtStart {
			at = " gone at the agent's start"
		}
		fmt.Fprintf(&b, "missing: %s %s reported at #%d%s\n", m.Module, m.Path, m.Seq, at)
	}
	for _, c := range s.Crashes {
		var at []string
		for _, t := range c.Times {
			at = append(at, fmt.Sprintf("#%d", t.Sub(base)/time.Second))
		}
		fmt.Fprintf(&b, "crashes: %s at %s: %s\n", c.Module, orNone(c.Build), strings.Join(at, " "))
	}
	if p := s.Provisioner; p != nil {
		fmt.Fprintf(&b, "provisioner: up=%v since #%d claim=%s why=%s\n", p.Up, p.Seq, p.Claim, orNone(string(p.Why)))
	}
	if n := s.Noisy; n != nil {
		fmt.Fprintf(&b, "noisy: %s, from #%d through #%d (%d events, %d bytes)\n", n, n.Seq, n.LastSeq, n.Events(), n.Bytes)
	}
	v := s.View()
	if p := v.ProvisionerDown(); p != nil {
		fmt.Fprintf(&b, "view: provisioner down since #%d\n", p.Seq)
	}
	fmt.Fprintf(&b, "view: account plan=%s runs=%s modules=%d files=%d held=%d",
		orNone(v.ProvisionerAccount), orNone(v.RunningAccount), v.Modules, v.Files, v.Held)
	for _, hd := range v.Holds {
		fmt.Fprintf(&b, "\nview: hold %s why=%s carries=%s pending=%s", hd.Module, hd.Why, orNone(hd.Build), orNone(hd.Pending))
	}
	if v.Withheld != nil {
		b.WriteString("\nview: withheld by the pause:" + formatDiff(*v.Withheld, "  "))
	}
	return b.String()
}
