package reconciletest

import (
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/meshfold/meshfold/events"
)

// Lines returns s's lines, trimmed, without the empty ones.
func Lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// U64 reads a decimal sequence; "" is 0. A bad number fails t.
func U64(t testing.TB, s string) uint64 {
	t.Helper()
	if s == "" {
		return 0
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("bad number %q", s)
	}
	return n
}

// WantModule reads a script's want line, "NAME BUILD [runs_as=X]
// [files=P:M,P:M] [provisioner] [requires_approval] [hold]" (a file's
// mode defaults to 0600). A bad line fails t.
func WantModule(t testing.TB, line string) events.WantModule {
	t.Helper()
	f := strings.Fields(line)
	if len(f) < 2 {
		t.Fatalf("want line wants NAME BUILD [options]: %q", line)
	}
	m := events.WantModule{Name: f[0], Build: f[1]}
	for _, opt := range f[2:] {
		k, v, _ := strings.Cut(opt, "=")
		switch k {
		case "runs_as":
			m.RunsAs = v
		case "files":
			for _, pm := range strings.Split(v, ",") {
				p, mode, _ := strings.Cut(pm, ":")
				if mode == "" {
					mode = "0600"
				}
				m.Files = append(m.Files, events.File{Path: p, Mode: events.Mode(mode)})
			}
		case "provisioner":
			m.Provisioner = true
		case "requires_approval":
			m.RequiresApproval = true
		case "hold":
			m.Hold = true
		default:
			t.Fatalf("unknown want option %q", opt)
		}
	}
	return m
}

// Script is the one handler of the input commands of the datadriven
// scripts of reconcile and reconcile/audit: each appends one event of
// Node to Stream, which folds it and appends its effects. The query
// commands, which print, are each suite's own.
//
// The input commands and their arguments:
//
//	want                 one module a line (see [WantModule])
//	have                 one module a line: NAME BUILD|- STATE [account=X]
//	                     [restarts=N] [fill_restarts=N]
//	                     [exit=X] (exit=status_1 is "status 1")
//	                     [since=SEQ] (the stream time of SEQ)
//	                     [health=starting|healthy|unhealthy]; args: [no_plan=true]
//	                     [looked=SEQ] (the have's LookedBefore)
//	approve module= build= [by=ops]
//	settle plan= [module=] [op=apply] [error=]
//	refusal module= path= reason= [plan=] writer= [error=]
//	filled module= path= [plan=]
//	pause [by=ops] [reason=]; resume [by=ops]; poke [by=ops] [reason=]
//	revoke module= build= [by=ops]; waive module= path= [by=ops]
//	retire [by=ops] [force=true]
//	gate module= [lift=true] [by=ops] [reason=]
//	raw kind=K           the input as the payload's bytes, decoded as a
//	                     reader of the stream decodes it
//	forged               a plan on the node's subject that the reconciler
//	                     did not emit (its signature does not verify)
type Script struct {
	Stream *Stream
	Node   string
}

// Input appends the event d's command describes and returns it, with true;
// false, and nothing appended, when d's command is not an input command. A
// malformed line fails t.
func (sc *Script) Input(t testing.TB, d *datadriven.TestData) (events.Event, bool) {
	t.Helper()
	args := map[string]string{}
	for _, a := range d.CmdArgs {
		args[a.Key] = strings.Join(a.Vals, ",")
	}
	by := func() string {
		if b := args["by"]; b != "" {
			return b
		}
		return "ops"
	}
	var p events.Payload
	switch d.Cmd {
	case "want":
		w := &events.Want{}
		for _, line := range Lines(d.Input) {
			w.Modules = append(w.Modules, WantModule(t, line))
		}
		p = w
	case "have":
		// started=CLAIM: the claim of the agent whose start the files
		// of at_start were gone at.
		hv := &events.Have{NoPlan: args["no_plan"] == "true", Started: args["started"]}
		if v := args["looked"]; v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				d.Fatalf(t, "have looked=%q: %v", v, err)
			}
			hv.LookedBefore = n
		}
		for _, line := range Lines(d.Input) {
			hv.Modules = append(hv.Modules, sc.haveModule(t, d, line))
		}
		// missing=MODULE:PATH[,MODULE:PATH…]: files the agent reports
		// missing on the node; at_start=MODULE:PATH[,…]: those it
		// reports gone at its start (MissingFile.AtStart).
		for _, arg := range []string{"missing", "at_start"} {
			if args[arg] == "" {
				continue
			}
			for _, mp := range strings.Split(args[arg], ",") {
				module, path, ok := strings.Cut(mp, ":")
				if !ok {
					t.Fatalf("%s: %s=%s: want MODULE:PATH", d.Pos, arg, mp)
				}
				hv.Missing = append(hv.Missing, events.MissingFile{Module: module, Path: path, AtStart: arg == "at_start"})
			}
		}
		p = hv
	case "approve":
		p = &events.Approve{Module: args["module"], Build: args["build"], By: by()}
	case "settle":
		op := args["op"]
		if op == "" {
			op = "apply"
		}
		p = &events.Settle{Module: args["module"], Op: events.SettleOp(op), Plan: U64(t, args["plan"]), Error: args["error"], Untrusted: args["untrusted"] == "true"}
	case "refusal":
		p = &events.Refusal{Module: args["module"], Path: args["path"], Reason: events.Reason(args["reason"]),
			Plan: U64(t, args["plan"]), Writer: args["writer"], Error: args["error"]}
	case "filled":
		// claim=C: the claim of the agent that wrote it.
		p = &events.Filled{Module: args["module"], Path: args["path"], Plan: U64(t, args["plan"]), Digest: "hmac:not-a-secret", Claim: args["claim"]}
	case "pause":
		p = &events.Pause{By: by(), Reason: args["reason"]}
	case "resume":
		p = &events.Resume{By: by()}
	case "poke":
		p = &events.Poke{By: by(), Reason: args["reason"]}
	case "revoke":
		p = &events.Revoke{Module: args["module"], Build: args["build"], By: by()}
	case "waive":
		p = &events.Waive{Module: args["module"], Path: args["path"], By: by()}
	case "retire":
		p = &events.Retire{By: by(), Force: args["force"] == "true"}
	case "gate":
		p = &events.Gate{Module: args["module"], Lift: args["lift"] == "true", By: by(), Reason: args["reason"]}
	case "ack": // ack [upto=SEQ] [by=NAME]
		var upto uint64
		if args["upto"] != "" {
			upto = U64(t, args["upto"])
		}
		p = &events.Ack{By: by(), Upto: upto, Reason: args["reason"]}
	case "agent": // agent state=up|down claim=C [why=expired] [host=H pid=N]
		pid := 0
		if args["pid"] != "" {
			pid = int(U64(t, args["pid"]))
		}
		p = &events.Agent{State: events.AgentState(args["state"]), Claim: args["claim"], Host: args["host"], PID: pid,
			Why: events.AgentWhy(args["why"])}
	case "prov": // prov state=up|down claim=C [why=expired] [host=H pid=N] [no_plan=true|old_key=true] [looked=SEQ]: the provisioner's lease
		pid := 0
		if args["pid"] != "" {
			pid = int(U64(t, args["pid"]))
		}
		pv := &events.Prov{Agent: events.Agent{State: events.AgentState(args["state"]), Claim: args["claim"], Host: args["host"], PID: pid,
			Why: events.AgentWhy(args["why"])}, NoPlan: args["no_plan"] == "true", OldKey: args["old_key"] == "true"}
		if v := args["looked"]; v != "" {
			pv.LookedBefore = U64(t, v)
		}
		p = pv
	case "raw":
		return sc.Stream.AppendRaw(sc.Node, events.Kind(args["kind"]), []byte(d.Input)), true
	case "forged":
		pl, err := events.Decode(events.KindPlan, []byte(d.Input))
		return sc.Stream.AppendEvent(events.Event{Node: sc.Node, Kind: events.KindPlan, Payload: pl, Err: err, Foreign: true}), true
	case "old-key": // a plan signed with a key the reconciler no longer signs with (retired)
		pl, err := events.Decode(events.KindPlan, []byte(d.Input))
		return sc.Stream.AppendEvent(events.Event{Node: sc.Node, Kind: events.KindPlan, Payload: pl, Err: err, OldKey: true}), true
	default:
		return events.Event{}, false
	}
	return sc.Stream.Append(sc.Node, p), true
}

// haveModule reads a have line.
func (sc *Script) haveModule(t testing.TB, d *datadriven.TestData, line string) events.HaveModule {
	t.Helper()
	f := strings.Fields(line)
	if len(f) < 3 {
		t.Fatalf("%s: have line wants NAME BUILD STATE [account=X restarts=N fill_restarts=N exit=X since=SEQ health=H]: %q", d.Pos, line)
	}
	m := events.HaveModule{Name: f[0], Build: f[1], State: events.RunState(f[2])}
	if m.Build == "-" {
		m.Build = ""
	}
	for _, kv := range f[3:] {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "account":
			m.Account = v
		case "restarts":
			m.Restarts = int(U64(t, v))
		case "fill_restarts":
			m.FillRestarts = int(U64(t, v))
		case "exit": // exit=status_1 is "status 1"
			m.Exit = strings.ReplaceAll(v, "_", " ")
		case "since": // since=SEQ: the time of that sequence
			at := sc.Stream.TimeOf(U64(t, v))
			m.Since = &at
		case "health":
			m.Health = events.Health(v)
		default:
			t.Fatalf("%s: have line: unknown field %q in %q", d.Pos, kv, line)
		}
	}
	return m
}
