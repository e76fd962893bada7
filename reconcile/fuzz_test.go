package reconcile_test

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
	"github.com/meshfold/meshfold/reconcile"
)

// FuzzDecodeFold decodes a node's history, one event a line ("kind json"),
// and folds it. Whatever the bytes, the fold must not panic, its
// invariants must hold after every step, and refolding an event must
// change nothing. Seeded with the events of every testdata script.
//
//	go test ./reconcile -run '^$' -fuzz FuzzDecodeFold -fuzztime 60s
func FuzzDecodeFold(f *testing.F) {
	scripts, _ := filepath.Glob("testdata/*.txt")
	for _, path := range scripts {
		h := newHarness(f, "ace")
		for _, d := range readScript(f, path) {
			h.run(f, d)
		}
		var seed bytes.Buffer
		for _, ev := range h.Stream.Events {
			if ev.Payload == nil {
				continue
			}
			b, _ := json.Marshal(ev.Payload)
			seed.WriteString(string(ev.Kind) + " ")
			seed.Write(b)
			seed.WriteByte('\n')
		}
		f.Add(seed.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s := reconcile.NewState("ace")
		var folded []events.Event
		for i, line := range bytes.Split(data, []byte("\n")) {
			kind, payload, _ := bytes.Cut(line, []byte(" "))
			ev := events.Event{Seq: uint64(i + 1), Node: "ace", Kind: events.Kind(kind), Time: time.Unix(int64(i), 0)}
			ev.Payload, ev.Err = events.Decode(ev.Kind, payload)
			s.Fold(ev)
			if err := s.CheckInvariants(); err != nil {
				t.Fatalf("after line %d: %v", i+1, err)
			}
			folded = append(folded, ev)
		}
		before, _ := json.Marshal(s)
		for _, ev := range folded {
			if effs := s.Fold(ev); len(effs) > 0 {
				t.Fatalf("refolding #%d gave effects", ev.Seq)
			}
		}
		if after, _ := json.Marshal(s); !bytes.Equal(before, after) {
			t.Fatal("refolding changed the state")
		}
	})
}

// readScript reads a testdata script's commands without running them
// through datadriven, whose runner does not work inside fuzz workers: a
// command line, its input up to "----", and its expected output up to a
// blank line.
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
