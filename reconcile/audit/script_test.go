package audit_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
)

// base is the scripts' clock: event N is on the stream at base + N s.
var base = time.Date(2026, 11, 3, 20, 50, 0, 0, time.UTC)

// TestScripts runs the golden scripts of testdata/. Input commands
// (reconciletest.Script: want, have, approve, settle, refusal, filled,
// raw, the operator events) append an event of the current node to a
// simulated stream and fold it with the reconciler's fold; the effects it
// returns are appended after it (reconciletest.Stream).
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
			s := &script{reconciletest.Script{Stream: reconciletest.New(base, time.Second), Node: "ace"}}
			datadriven.RunTestAny(t, path, func(t testing.TB, d *datadriven.TestData) string {
				return s.run(t, d)
			})
		})
	}
}

// script is the scripts' fleet on one stream, and the node the input
// commands are of.
type script struct{ reconciletest.Script }

func (s *script) history(t testing.TB) *audit.History {
	h, err := audit.NewHistory(s.Node, s.Stream.Node(s.Node))
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
	from := s.Stream.Next()
	if _, ok := s.Input(t, d); ok {
		return s.appended(from)
	}
	switch d.Cmd {
	case "node":
		s.Node = args["name"]
		return "ok"
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
			audit.FleetFailedText([]audit.FleetRow{row}) + audit.FleetMissingText([]audit.FleetRow{row}) +
			audit.FleetSourcesText([]audit.FleetRow{row}, h.Events[len(h.Events)-1].Time)
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
	return ""
}

// appended lists the events appended from sequence from on, as the
// timeline summarises them.
func (s *script) appended(from uint64) string {
	h, err := audit.NewHistory(s.Node, s.Stream.Node(s.Node))
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
