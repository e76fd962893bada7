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

// TestScripts runs the datadriven scripts of testdata/: each command
// appends an event to a simulated stream of one node and folds it; the
// output shows the event and the effects the fold returned. Plans the fold
// emits are appended to the stream and folded at once (as the reconciler
// reads its own plan events), unless "hold-plans" holds them until
// "flush".
// Knocks and journals take a sequence too, as on the real stream.
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

type harness struct {
	node   string
	state  *reconcile.State
	stream []events.Event // stream[i].Seq == i+1
	paused bool
	queued []reconcile.Effect
	out    *strings.Builder
}

func newHarness(t testing.TB, node string) *harness {
	return &harness{node: node, state: reconcile.NewState(node)}
}

func (h *harness) run(t testing.TB, d *datadriven.TestData) string {
	h.out = new(strings.Builder)
	args := map[string]string{}
	for _, a := range d.CmdArgs {
		args[a.Key] = strings.Join(a.Vals, ",")
	}
	at := base.Add(time.Duration(len(h.stream)+1) * time.Second)
	var p events.Payload
	switch d.Cmd {
	case "node":
		*h = *newHarness(t, args["name"])
		return "ok"
	case "want":
		w := &events.Want{}
		for _, line := range reconciletest.Lines(d.Input) {
			w.Modules = append(w.Modules, reconciletest.WantModule(t, line))
		}
		p = w
	case "have":
		hv := &events.Have{}
		for _, line := range reconciletest.Lines(d.Input) {
			f := strings.Fields(line)
			if len(f) < 3 {
				t.Fatalf("%s: have line wants NAME BUILD STATE [account=X]: %q", d.Pos, line)
			}
			m := events.HaveModule{Name: f[0], Build: dash(f[1]), State: events.RunState(f[2])}
			for _, kv := range f[3:] {
				if v, ok := strings.CutPrefix(kv, "account="); ok {
					m.Account = v
				}
			}
			hv.Modules = append(hv.Modules, m)
		}
		p = hv
	case "approve":
		by := args["by"]
		if by == "" {
			by = "ops"
		}
		p = &events.Approve{Module: args["module"], Build: args["build"], By: by}
	case "settle":
		op := args["op"]
		if op == "" {
			op = "apply"
		}
		p = &events.Settle{Module: args["module"], Op: events.SettleOp(op), Plan: reconciletest.U64(t, args["plan"]), Error: args["error"]}
	case "refusal":
		p = &events.Refusal{Module: args["module"], Path: args["path"], Reason: events.Reason(args["reason"]),
			Plan: reconciletest.U64(t, args["plan"]), Writer: args["writer"], Error: args["error"]}
	case "filled":
		p = &events.Filled{Module: args["module"], Path: args["path"], Plan: reconciletest.U64(t, args["plan"]), Digest: "hmac:test"}
	case "raw":
		// A payload exactly as given, decoded as the reconciler decodes.
		k := events.Kind(args["kind"])
		pl, err := events.Decode(k, []byte(d.Input))
		h.append(t, events.Event{Kind: k, Payload: pl, Err: err, Time: at})
		return h.out.String()
	case "forged":
		// A plan on the node's plan subject that the reconciler did not
		// emit: its signature does not verify (the shell sets Foreign).
		pl, err := events.Decode(events.KindPlan, []byte(d.Input))
		h.append(t, events.Event{Kind: events.KindPlan, Payload: pl, Err: err, Time: at, Foreign: true})
		return h.out.String()
	case "refold":
		seq := reconciletest.U64(t, args["seq"])
		effs := h.state.Fold(h.stream[seq-1])
		h.check(t)
		fmt.Fprintf(h.out, "refold #%d: %d effects\n", seq, len(effs))
		return h.out.String()
	case "hold-plans":
		h.paused = true
		return "ok"
	case "pause":
		p = &events.Pause{By: orDefault(args["by"], "ops"), Reason: args["reason"]}
	case "resume":
		p = &events.Resume{By: orDefault(args["by"], "ops")}
	case "poke":
		p = &events.Poke{By: orDefault(args["by"], "ops"), Reason: args["reason"]}
	case "revoke":
		p = &events.Revoke{Module: args["module"], Build: args["build"], By: orDefault(args["by"], "ops")}
	case "waive":
		p = &events.Waive{Module: args["module"], Path: args["path"], By: orDefault(args["by"], "ops")}
	case "retire":
		p = &events.Retire{By: orDefault(args["by"], "ops"), Force: args["force"] == "true"}
	case "dry-run":
		var ms []events.WantModule
		for _, line := range reconciletest.Lines(d.Input) {
			ms = append(ms, reconciletest.WantModule(t, line))
		}
		before := formatState(h.state)
		out := formatDryRun(h.state.DryRun(ms))
		if after := formatState(h.state); after != before {
			t.Fatalf("%s: the dry run changed the state:\n%s\n%s", d.Pos, before, after)
		}
		return out
	case "stuck":
		// What is stuck, N seconds after the scripts' base time.
		now := base.Add(time.Duration(reconciletest.U64(t, args["at"])) * time.Second)
		return formatStuck(h.state.View().Stuck(now))
	case "flush":
		h.paused = false
		q := h.queued
		h.queued = nil
		for _, e := range q {
			h.publish(t, e)
		}
		return h.out.String()
	case "state":
		return formatState(h.state)
	case "judge":
		var account string
		var rows []events.PlanModule
		if s := h.state.Settled; s != nil {
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
	events.Stamp(p, at)
	h.append(t, events.Event{Kind: p.Kind(), Payload: p, Time: at})
	return h.out.String()
}

// append puts ev on the stream with the next sequence, folds it and
// publishes its effects.
func (h *harness) append(t testing.TB, ev events.Event) {
	ev.Seq = uint64(len(h.stream) + 1)
	ev.Node = h.node
	h.stream = append(h.stream, ev)
	fmt.Fprintf(h.out, "#%d %s\n", ev.Seq, summary(ev))
	effs := h.state.Fold(ev)
	h.check(t)
	for _, e := range effs {
		if e.Kind == events.KindPlan && h.paused {
			fmt.Fprintf(h.out, "  queued %s\n", formatEffect(e, 0))
			h.queued = append(h.queued, e)
			continue
		}
		h.publish(t, e)
	}
}

// publish appends an effect to the stream; the reconciler folds its plan
// events (they bind the plan's sequence), not its knocks and journals.
func (h *harness) publish(t testing.TB, e reconcile.Effect) {
	seq := uint64(len(h.stream) + 1)
	ev := events.Event{Seq: seq, Node: h.node, Kind: e.Kind, Payload: e.Payload, Time: base.Add(time.Duration(seq) * time.Second)}
	h.stream = append(h.stream, ev)
	fmt.Fprintf(h.out, "  %s\n", formatEffect(e, seq))
	if e.Kind != events.KindPlan {
		return
	}
	for _, e2 := range h.state.Fold(ev) {
		fmt.Fprintf(h.out, "  %s\n", formatEffect(e2, 0))
	}
	h.check(t)
}

func (h *harness) check(t testing.TB) {
	t.Helper()
	if err := h.state.CheckInvariants(); err != nil {
		t.Fatalf("invariant broken: %v\n%s", err, formatState(h.state))
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
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

func dash(s string) string {
	if s == "-" {
		return ""
	}
	return s
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
		return "have " + strings.Join(parts, " ")
	case *events.Approve:
		return fmt.Sprintf("approve %s %s by=%s", p.Module, p.Build, p.By)
	case *events.Settle:
		s := fmt.Sprintf("settle plan=%d module=%s op=%s", p.Plan, p.Module, p.Op)
		if p.Error != "" {
			s += " error=" + p.Error
		}
		return s
	case *events.Refusal:
		return fmt.Sprintf("refusal %s %s %s plan=%d writer=%s", p.Module, p.Path, p.Reason, p.Plan, p.Writer)
	case *events.Filled:
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
	if e := s.Emitted(); e != nil {
		fmt.Fprintf(&b, "emitted: plan %s cause=%d account=%s\n", seq(e), e.Cause, orNone(e.Account))
	}
	for _, a := range s.Accepting {
		fmt.Fprintf(&b, "accepting: %s %s from %s since plan %d\n", a.Module, a.Path, a.Account, a.Plan)
	}
	for _, f := range s.Filled {
		fmt.Fprintf(&b, "filled: %s %s at plan %d\n", f.Module, f.Path, f.Plan)
	}
	for _, a := range s.Approvals {
		fmt.Fprintf(&b, "approval: %s %s by %s (#%d)\n", a.Module, a.Build, a.By, a.Seq)
	}
	for _, it := range s.Owed {
		fmt.Fprintf(&b, "owed: %s (#%d)\n", formatOwed(it.Owed), it.Seq)
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
	v := s.View()
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
