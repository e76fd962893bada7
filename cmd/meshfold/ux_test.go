package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// What a new user typed wrong is told as what it is (issue 27's README
// run): a rollout of a fleet with none is named, with where the names
// are, exit 2; an argument to a verb that takes none is said to be one,
// not an unknown command; counts agree with their nouns.
func TestUsageMessagesAsUsersMeetThem(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	for _, args := range [][]string{{"rollout", "status", "nosuch"}, {"rollout", "why", "nosuch", "ace"}, {"rollout", "promote", "nosuch", "--by", "alice"}} {
		out, errs, code := m.cli(t, args...)
		if code != exitUsage || out != "" || !strings.Contains(errs, `no rollout of fleet "nosuch"`) || !strings.Contains(errs, "meshfold rollout ls") ||
			strings.Contains(errs, "feed:") {
			t.Errorf("%v: exit %d, stderr %q; want exit %d naming the fleet and 'meshfold rollout ls', without the package's words", args, code, errs, exitUsage)
		}
	}
	for _, args := range [][]string{{"fleet", "extra-arg"}, {"rollout", "ls", "web"}, {"build", "ls", "x"}, {"console", "x"}} {
		_, errs, code := m.cli(t, args...)
		if code != exitUsage || !strings.Contains(errs, "takes no arguments (got \""+args[len(args)-1]+"\")") || strings.Contains(errs, "unknown command") {
			t.Errorf("%v: exit %d, stderr %q; want exit %d saying it takes no arguments", args, code, errs, exitUsage)
		}
	}
	if _, errs, _ := m.cli(t, "fleet", "ace"); !strings.Contains(errs, "meshfold state NODE") {
		t.Errorf("fleet ace: %q does not say where one node's state is", errs)
	}
	one := writeFleet(t, "fleet: web\nnodes: {ace: {}}\ngroups:\n  - name: all\n    select: {}\n    modules: [{name: web, build: \"web:2\"}]\n")
	out, errs, code := m.cli(t, "apply", "-f", one, "--dry-run")
	if code != 0 || !strings.Contains(out, "fleet web: 1 target of 1 node;") {
		t.Errorf("apply --dry-run of one node: exit %d, want '1 target of 1 node'\n%s%s", code, out, errs)
	}
	same := writeFleet(t, "fleet: web\nnodes: {ace: {}}\ngroups:\n  - name: all\n    select: {}\n    modules: [{name: web, build: \"web:1\"}]\n")
	if out, errs, code := m.cli(t, "apply", "-f", same, "--dry-run"); code != 0 || !strings.Contains(out, "fleet web: 1 node, no want changes") {
		t.Errorf("apply --dry-run, no change: exit %d, want '1 node, no want changes'\n%s%s", code, out, errs)
	}
}

// One exit-code table for every command (meshfold --help, README "Exit
// codes"): a node the stream holds no event of is a name the user got
// wrong, exit 2, whether a verb or a read meets it (state and audit once
// exited 1 where retire exited 2).
func TestUnknownNodeExitsTheSameEverywhere(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	for _, args := range [][]string{
		{"retire", "zed", "--by", "alice"},
		{"pause", "zed", "--by", "alice"},
		{"ack", "zed", "--by", "alice"},
		{"state", "zed", "--timeout", "100ms"},
		{"audit", "zed"},
		{"rollout", "status", "zed"},
	} {
		out, errs, code := m.cli(t, args...)
		if code != exitUsage || out != "" || !strings.Contains(errs, "zed") {
			t.Errorf("meshfold %s: exit %d, stdout %q, stderr %q; want exit %d naming zed", strings.Join(args, " "), code, out, errs, exitUsage)
		}
	}
	for _, args := range [][]string{{"state", "zed", "--timeout", "100ms"}, {"audit", "zed"}} {
		if _, errs, _ := m.cli(t, args...); !strings.Contains(errs, "'meshfold fleet --all' lists the nodes") {
			t.Errorf("meshfold %s: %q does not say where the nodes are listed", strings.Join(args, " "), errs)
		}
		// It names the server it asked, once, without the URL's
		// credentials: an operator with two servers read "no events" as
		// "zed does not exist" (a fresh user's finding U1). The server
		// has no auth, so it takes any user and password.
		u := strings.Replace(m.e.ClientURL(), "nats://", "nats://alice:s3cret@", 1)
		var out bytes.Buffer
		var errb storetest.SyncBuffer
		run(testCtx(t), append(append([]string{}, args...), "--server", u), nil, &out, &errb)
		if errs := errb.String(); strings.Count(errs, m.e.ClientURL()) != 1 || strings.Contains(errs, "s3cret") || strings.Contains(errs, "alice") {
			t.Errorf("meshfold %s --server %s: %q does not name %s once, without its credentials", strings.Join(args, " "), u, errs, m.e.ClientURL())
		}
	}
	var help bytes.Buffer
	code := run(testCtx(t), []string{"--help"}, nil, &help, &bytes.Buffer{})
	out := help.String()
	flat := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{"Exit codes, the same for every command:", "2 usage:", "names a node, fleet or event the stream does not hold", "a module the node's agent does not run (logs NODE MODULE)", "3 conflict:"} {
		if code != 0 || !strings.Contains(flat, want) {
			t.Errorf("meshfold --help (exit %d) does not say %q:\n%s", code, want, out)
		}
	}
}

// The exit codes have one source, exitCodeTable: README.md's "Exit
// codes" table holds its rows word for word, and meshfold --help prints
// each meaning (without the backticks) in lines of at most 80 columns.
// The README's table once named `logs NODE nosuchmod`'s exit 2 and
// --help's did not.
func TestExitCodeTableIsTheReadmes(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n### Exit codes\n")
	if !ok {
		t.Fatal("README.md has no '### Exit codes' section")
	}
	var rows []string
	for _, line := range strings.Split(section, "\n") {
		if strings.HasPrefix(line, "#") {
			break
		}
		if strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "| code |") {
			rows = append(rows, line)
		}
	}
	var want []string
	for _, e := range exitCodeTable {
		want = append(want, fmt.Sprintf("| %d | %s |", e.Code, e.Meaning))
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("README.md's exit-code table:\n%s\nexitCodeTable (meshfold --help) says:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
	var help bytes.Buffer
	if code := run(testCtx(t), []string{"--help"}, nil, &help, &bytes.Buffer{}); code != 0 {
		t.Fatalf("meshfold --help: exit %d", code)
	}
	flat := strings.Join(strings.Fields(help.String()), " ")
	for _, e := range exitCodeTable {
		if m := fmt.Sprintf("%d %s", e.Code, strings.Join(strings.Fields(strings.ReplaceAll(e.Meaning, "`", "")), " ")); !strings.Contains(flat, m) {
			t.Errorf("meshfold --help does not say %q", m)
		}
	}
	for _, line := range strings.Split(exitCodesHelp, "\n") {
		if n := utf8.RuneCountInString(line); n > 80 {
			t.Errorf("meshfold --help: a line of %d columns: %q", n, line)
		}
	}
}

// A retirement waits for the node's agent to settle the empty plan: of a
// node no agent runs (none holds its lease), retire says it cannot
// finish so, and what to do; of a node whose agent runs, or with
// --force, it says nothing more.
func TestRetireSaysWhenNoAgentRuns(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	ctx := testCtx(t)
	kv, err := store.OpenNodeLeases(ctx, m.js, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := store.AcquireLease(ctx, kv, "bob", store.NewHolder("node", "bob"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })

	out, errs, code := m.cli(t, "retire", "ace", "--by", "alice")
	if code != 0 || !strings.Contains(out, "retire ace: stream sequence") {
		t.Fatalf("retire ace: exit %d\n%s%s", code, out, errs)
	}
	for _, want := range []string{"no agent of ace runs", "finishes only once ace's agent settles the empty plan", "'meshfold fleet' lists ace as retiring", "'meshfold node ace'", "'meshfold retire ace --force --by NAME'"} {
		if !strings.Contains(errs, want) {
			t.Errorf("retire of a node no agent runs: stderr does not say %q:\n%s", want, errs)
		}
	}
	if out, errs, code := m.cli(t, "retire", "bob", "--by", "alice"); code != 0 || !strings.Contains(out, "retire bob: stream sequence") || strings.Contains(errs, "no agent") {
		t.Errorf("retire of a node whose agent runs: exit %d, stderr %q; want no note\n%s", code, errs, out)
	}
	if out, errs, code := m.cli(t, "retire", "cat", "--by", "alice", "--force"); code != 0 || !strings.Contains(out, "retire cat: stream sequence") || strings.Contains(errs, "no agent") {
		t.Errorf("retire --force: exit %d, stderr %q; want no note\n%s", code, errs, out)
	}
}
