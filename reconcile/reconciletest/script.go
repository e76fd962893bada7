package reconciletest

import (
	"strconv"
	"strings"
	"testing"

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
