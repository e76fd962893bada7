package audit_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
)

// base is the scripts' clock: event N is on the stream at base + N s.
var base = time.Date(2026, 11, 3, 20, 50, 0, 0, time.UTC)

// TestScripts runs the golden scripts of testdata/. Input commands (want,
// have, approve, settle, refusal, filled, raw) append an event of the
// current node to a simulated stream and fold it with the reconciler's
// fold; the effects it returns are appended after it (reconciletest.Stream).
// The output lists what was appended. Query commands print what `meshfold
// audit` prints: timeline [since=B] [until=B] [json], why seq=N [json],
// asof bound=B [json].
//
// Rewrite the expectations with: go test ./reconcile/audit -run TestScripts -rewrite
func TestScripts(t *testing.T) {
	scripts, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no scripts in testdata: %v", err)
	}
	for _, path := range scripts {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			s := &script{stream: reconciletest.New(base, time.Second), node: "ace"}
			datadriven.RunTestAny(t, path, func(t testing.TB, d *datadriven.TestData) string {
				return s.run(t, d)
			})
		})
	}
}

type script struct {
	stream *reconciletest.Stream
	node   string
}

func (s *script) history(t testing.TB) *audit.History {
	h, err := audit.NewHistory(s.node, s.stream.Node(s.node))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (s *script) bound(t testing.TB, d *datadriven.TestData, key string) (audit.Bound, bool) {
	for _, a := range d.CmdArgs {
		if a.Key == key {
			b, err := audit.ParseBound(strings.Join(a.Vals, ","))
			if err != nil {
				t.Fatalf("%s: %v", d.Pos, err)
			}
			return b, true
		}
	}
	return audit.Bound{}, false
}

func (s *script) run(t testing.TB, d *datadriven.TestData) string {
	args := map[string]string{}
	for _, a := range d.CmdArgs {
		args[a.Key] = strings.Join(a.Vals, ",")
	}
	asJSON := d.HasArg("json")
	var p events.Payload
	switch d.Cmd {
	case "node":
		s.node = args["name"]
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
				t.Fatalf("%s: have line wants NAME BUILD STATE [account=X restarts=N exit=X since=SEQ]: %q", d.Pos, line)
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
					m.Restarts = int(reconciletest.U64(t, v))
				case "exit": // exit=status_1 is "status 1"
					m.Exit = strings.ReplaceAll(v, "_", " ")
				case "since": // since=SEQ: the time of that sequence
					at := s.stream.TimeOf(reconciletest.U64(t, v))
					m.Since = &at
				}
			}
			hv.Modules = append(hv.Modules, m)
		}
		p = hv
	case "approve":
		p = &events.Approve{Module: args["module"], Build: args["build"], By: args["by"]}
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
		p = &events.Filled{Module: args["module"], Path: args["path"], Plan: reconciletest.U64(t, args["plan"]), Digest: "hmac:not-a-secret"}
	case "raw":
		return s.appended(func() { s.stream.AppendRaw(s.node, events.Kind(args["kind"]), []byte(d.Input)) })
	case "timeline":
		h := s.history(t)
		from, to := 0, len(h.Events)
		var notes []string
		if b, ok := s.bound(t, d, "since"); ok {
			var n string
			from, n = h.Since(b)
			notes = append(notes, n)
		}
		if b, ok := s.bound(t, d, "until"); ok {
			var n string
			to, n = h.Until(b)
			notes = append(notes, n)
		}
		var out strings.Builder
		for _, n := range notes {
			if n != "" {
				out.WriteString(audit.NoteText(n))
			}
		}
		entries := h.Timeline(from, max(from, to))
		for _, e := range entries {
			if asJSON {
				b, err := json.Marshal(e)
				if err != nil {
					t.Fatal(err)
				}
				out.Write(b)
				out.WriteByte('\n')
				continue
			}
			out.WriteString(e.Line(audit.SeqWidth(entries)) + "\n")
		}
		return out.String()
	case "fleet":
		// The node's fleet line and needs, as of its last event.
		h := s.history(t)
		st := h.Fold(len(h.Events))
		row := audit.FleetRowOf(st, h.Events[len(h.Events)-1].Time, 10*time.Minute)
		return audit.FleetHeader(4) + "\n" + row.Line(4) + "\nattention: " + strings.Join(row.Attention, ",") + "\n" +
			audit.FleetFailedText([]audit.FleetRow{row})
	case "why":
		w, err := s.history(t).Why(reconciletest.U64(t, args["seq"]))
		if err != nil {
			return "error: " + err.Error()
		}
		if asJSON {
			b, err := json.MarshalIndent(w, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
		return w.Text()
	case "asof":
		b, _ := s.bound(t, d, "bound")
		a := s.history(t).AsOf(b)
		if asJSON {
			a.State = nil // the view and composition are what a reader checks here
			out, err := json.MarshalIndent(a, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			return string(out)
		}
		return a.Text()
	default:
		t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	}
	return s.appended(func() { s.stream.Append(s.node, p) })
}

// appended runs add and lists the events it appended, as the timeline
// summarises them.
func (s *script) appended(add func()) string {
	from := s.stream.Next()
	add()
	h, err := audit.NewHistory(s.node, s.stream.Node(s.node))
	if err != nil {
		panic(err)
	}
	var out strings.Builder
	for _, e := range h.Timeline(0, len(h.Events)) {
		if e.Seq < from {
			continue
		}
		indent := "  "
		if e.Seq == from {
			indent = ""
		}
		fmt.Fprintf(&out, "%s#%d %s %s\n", indent, e.Seq, e.Kind, e.Summary)
	}
	return out.String()
}
