package rollout_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
)

// FuzzDecodeFold decodes a fleet's history, one event a line ("kind json"
// for the rollout's events, "node kind json" for a node's), and folds it.
// Whatever the bytes, the fold must not panic, its invariants must hold
// after every step, refolding an event must change nothing, and a
// snapshot must decode to the same state. Seeded with the events of every
// testdata script.
//
//	go test ./rollout -run '^$' -fuzz FuzzDecodeFold -fuzztime 60s
func FuzzDecodeFold(f *testing.F) {
	scripts, _ := filepath.Glob("testdata/*.txt")
	for _, path := range scripts {
		h := newHarness("web")
		for _, d := range readScript(f, path) {
			h.run(f, d)
		}
		var seed bytes.Buffer
		for _, in := range h.stream {
			var b []byte
			switch p := in.Payload.(type) {
			case nil:
				b = []byte(`{"v":1,"at":"2026-12-01T20:00:00Z","modules":[]}`)
			case *rollout.Have:
				hv := &events.Have{}
				for _, m := range p.Modules {
					hv.Modules = append(hv.Modules, events.HaveModule{Name: m.Name, Build: m.Build, State: m.State, Health: m.Health, Restarts: m.Restarts})
				}
				b, _ = json.Marshal(events.Stamp(hv, in.Time))
			case events.Payload:
				if events.HeaderOf(p).V == 0 {
					events.Stamp(p, in.Time)
				}
				b, _ = json.Marshal(p)
			default:
				b, _ = json.Marshal(rollout.Stamp(p, in.Time))
			}
			if in.Node != "" {
				seed.WriteString(in.Node + " ")
			}
			seed.WriteString(string(in.Kind) + " ")
			seed.Write(b)
			seed.WriteByte('\n')
		}
		f.Add(seed.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s := rollout.NewState("web")
		var folded []rollout.Input
		for i, line := range bytes.Split(data, []byte("\n")) {
			seq, at := uint64(i+1), time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC).Add(time.Duration(i)*7*time.Second)
			head, payload, _ := bytes.Cut(line, []byte(" "))
			var in rollout.Input
			if k := rollout.Kind(head); rollout.New(k) != nil {
				in = rollout.FromRolloutEvent(k, payload, seq, at)
			} else {
				kind, rest, _ := bytes.Cut(payload, []byte(" "))
				ev := events.Event{Seq: seq, Time: at, Node: string(head), Kind: events.Kind(kind)}
				switch ev.Kind {
				case "down", "up", "prov-down", "prov-up":
					in = rollout.Input{Seq: seq, Time: at, Node: ev.Node, Kind: rollout.Kind(kind)}
				default:
					ev.Payload, ev.Err = events.Decode(ev.Kind, rest)
					var ok bool
					if in, ok = rollout.FromNodeEvent(ev); !ok {
						continue
					}
				}
			}
			s.Fold(in)
			if err := s.CheckInvariants(); err != nil {
				t.Fatalf("after line %d: %v", i+1, err)
			}
			folded = append(folded, in)
		}
		before, _ := json.Marshal(s)
		for _, in := range folded {
			if effs := s.Fold(in); len(effs) > 0 {
				t.Fatalf("refolding #%d gave effects", in.Seq)
			}
		}
		after, _ := json.Marshal(s)
		if !bytes.Equal(before, after) {
			t.Fatal("refolding changed the state")
		}
		if _, err := rollout.UnmarshalState(after); err != nil {
			t.Fatal(err)
		}
		_ = s.View()
		if r := s.Rollout; r != nil {
			for name := range r.Nodes {
				s.Why(name)
			}
		}
	})
}

// readScript returns a script's commands without running them (as
// reconcile's fuzz target reads its scripts).
func readScript(t testing.TB, path string) []*datadriven.TestData {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []*datadriven.TestData
	lines := strings.Split(string(b), "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		f := strings.Fields(l)
		d := &datadriven.TestData{Cmd: f[0]}
		for _, a := range f[1:] {
			k, v, _ := strings.Cut(a, "=")
			d.CmdArgs = append(d.CmdArgs, datadriven.CmdArg{Key: k, Vals: []string{v}})
		}
		var input []string
		for i++; i < len(lines) && lines[i] != "----"; i++ {
			input = append(input, lines[i])
		}
		d.Input = strings.Join(input, "\n")
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != ""; i++ {
		}
		out = append(out, d)
	}
	return out
}
