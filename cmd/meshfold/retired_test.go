package main

import (
	"context"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/events"
)

// The verbs that take --all skip a retired (or retiring) node under --all,
// saying how many they skipped; naming one is refused (exit 1, nothing
// published, who retired it and how to bring it back). A later want brings
// it back into --all.
func TestAllVerbsSkipRetiredNodes(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	for _, n := range []string{"ace", "bob", "cat"} {
		if code, _, stderr := c.run(t, "", "want", n, "--new", "-f", writeWantFile(t, goodWant)); code != 0 {
			t.Fatalf("want %s: %s", n, stderr)
		}
	}
	if code, _, stderr := c.run(t, "", "retire", "bob", "--by", "alice", "--force"); code != 0 {
		t.Fatalf("retire bob: %s", stderr)
	}
	msgs := func() uint64 {
		t.Helper()
		i, err := c.stream.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return i.State.Msgs
	}
	for _, args := range [][]string{
		{"poke", "--all", "--by", "x"},
		{"pause", "--all", "--by", "x"},
		{"resume", "--all", "--by", "x"},
		{"approve", "--all", "nats", "img:2", "--by", "x", "--ahead"},
	} {
		code, stdout, stderr := c.run(t, "", args...)
		if code != 0 || strings.Count(stdout, "stream sequence") != 2 || strings.Contains(stdout, " bob:") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
		if !strings.Contains(stderr, "--all skipped 1 retired node (retired or retiring: bob)") {
			t.Errorf("%v: stderr %q does not say bob was skipped", args, stderr)
		}
		if _, ok := c.last(t, "bob", events.Kind(args[0])); ok {
			t.Errorf("%v reached retired bob", args)
		}
	}
	before := msgs()
	for _, args := range [][]string{
		{"poke", "bob", "--by", "x"},
		{"pause", "ace", "bob", "--by", "x"}, // ace is not published either
		{"resume", "bob", "--by", "x"},
		{"approve", "bob", "nats", "img:2", "--by", "x"},
	} {
		code, _, stderr := c.run(t, "", args...)
		if code != exitError || !strings.Contains(stderr, "node bob is retired (retire #") || !strings.Contains(stderr, "by alice") ||
			!strings.Contains(stderr, "meshfold want bob -f FILE") {
			t.Errorf("%v: exit %d, stderr %q; want exit 1 saying bob is retired", args, code, stderr)
		}
	}
	if n := msgs(); n != before {
		t.Errorf("refused verbs published %d events", n-before)
	}
	// A later want brings bob back.
	if code, _, stderr := c.run(t, "", "want", "bob", "--new", "-f", writeWantFile(t, goodWant)); code != 0 {
		t.Fatalf("want bob again: %s", stderr)
	}
	code, stdout, stderr := c.run(t, "", "poke", "--all", "--by", "x")
	if code != 0 || strings.Count(stdout, "stream sequence") != 3 || strings.Contains(stderr, "skipped") {
		t.Errorf("poke --all after bob's want: exit %d, %q %q", code, stdout, stderr)
	}
	// Every node retired: --all says so and exits 1.
	for _, n := range []string{"ace", "bob", "cat"} {
		if code, _, stderr := c.run(t, "", "retire", n, "--by", "alice", "--force"); code != 0 {
			t.Fatalf("retire %s: %s", n, stderr)
		}
	}
	code, stdout, stderr = c.run(t, "", "poke", "--all", "--by", "x")
	if code != exitError || stdout != "" || !strings.Contains(stderr, "every node with a want (3) is retired or retiring") {
		t.Errorf("poke --all of retired nodes: exit %d, %q %q", code, stdout, stderr)
	}
}
