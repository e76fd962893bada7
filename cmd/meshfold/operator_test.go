package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
	"github.com/meshfold/meshfold/store"
)

// Each operator verb publishes its event of DESIGN.md §9, with by and the
// other fields from the command line, and prints its stream sequence.
func TestOperatorVerbsPublish(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	if code, _, stderr := c.run(t, "", "want", "ace", "--new", "-f", writeWantFile(t, goodWant)); code != 0 {
		t.Fatalf("want ace: %s", stderr)
	}
	for _, tc := range []struct {
		args  []string
		kind  events.Kind
		check func(p events.Payload) bool
	}{
		{[]string{"pause", "ace", "--by", "alice", "--reason", "disk swap"}, events.KindPause,
			func(p events.Payload) bool { x := p.(*events.Pause); return x.By == "alice" && x.Reason == "disk swap" }},
		{[]string{"resume", "ace", "--by", "bob"}, events.KindResume,
			func(p events.Payload) bool { return p.(*events.Resume).By == "bob" }},
		{[]string{"poke", "ace", "--by", "carol", "--reason", "creds rotated"}, events.KindPoke,
			func(p events.Payload) bool {
				x := p.(*events.Poke)
				return x.By == "carol" && x.Reason == "creds rotated"
			}},
		{[]string{"retire", "ace", "--by", "dave", "--force"}, events.KindRetire,
			func(p events.Payload) bool { x := p.(*events.Retire); return x.By == "dave" && x.Force }},
		{[]string{"revoke", "ace", "nats", "img:2", "--by", "erin", "--ahead"}, events.KindRevoke,
			func(p events.Payload) bool {
				x := p.(*events.Revoke)
				return x.Module == "nats" && x.Build == "img:2" && x.By == "erin"
			}},
		{[]string{"waive", "ace", "app", "/etc/app/key", "--by", "frank", "--ahead"}, events.KindWaive,
			func(p events.Payload) bool {
				x := p.(*events.Waive)
				return x.Module == "app" && x.Path == "/etc/app/key" && x.By == "frank"
			}},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			code, stdout, stderr := c.run(t, "", tc.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			m, ok := c.last(t, "ace", tc.kind)
			if !ok || m.Event.Seq != printedSeq(t, stdout) || !strings.HasPrefix(stdout, string(tc.kind)+" ace: ") {
				t.Fatalf("printed %q, stream has %+v", stdout, m.Event)
			}
			if m.Event.Err != nil || !tc.check(m.Event.Payload) {
				t.Errorf("%s: %+v (%v)", tc.kind, m.Event.Payload, m.Event.Err)
			}
		})
	}
}

// Usage errors exit 2 and publish nothing.
func TestOperatorVerbsUsage(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no node", []string{"pause", "--by", "alice"}, "name at least one NODE, or --all"},
		{"all and a node", []string{"pause", "ace", "--all", "--by", "alice"}, "--all names every node"},
		{"no by", []string{"poke", "ace"}, `required flag(s) "by"`},
		{"empty by", []string{"resume", "ace", "--by", ""}, "by: required"},
		{"bad node", []string{"poke", "Ace", "--by", "alice"}, "NODE"},
		{"one bad node of two", []string{"pause", "ace", "b@d", "--by", "alice"}, "NODE"},
		{"reason with a newline", []string{"pause", "ace", "--by", "alice", "--reason", "a\nb"}, "reason"},
		{"retire with no node", []string{"retire", "--by", "alice"}, "requires at least 1 arg"},
		{"revoke without build", []string{"revoke", "ace", "nats", "--by", "alice"}, "accepts 3 arg"},
		{"waive a relative path", []string{"waive", "ace", "app", "etc/key", "--by", "alice"}, "path"},
		{"approve without build", []string{"approve", "nats", "--by", "alice"}, "requires at least 2 arg"},
		{"approve no node", []string{"approve", "nats", "img:2", "--by", "alice"}, "name at least one NODE, or --all"},
		{"unknown output", []string{"state", "ace", "-o", "xml"}, `-o "xml"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := c.run(t, "", tc.args...)
			if code != exitUsage || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want %d naming %q", code, stderr, exitUsage, tc.want)
			}
		})
	}
	info, err := c.stream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Errorf("usage errors published %d events", info.State.Msgs)
	}
}

// A node the stream holds no want of (a mistyped name) is refused by the
// verbs that would make it a phantom node: exit 2, the node and fleet
// named, nothing published; --new acts on it anyway. approve takes a node
// with events but no want (an approval may come before the want) with a
// note, and one with no event only with --new, which its refusal names as
// the way to approve ahead of a node's first connection (a fresh user's
// finding: docs/operations.md said it took such a node with a note).
func TestOperatorVerbsRefuseUnknownNode(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	if code, _, stderr := c.run(t, "", "want", "ace", "--new", "-f", writeWantFile(t, goodWant)); code != 0 {
		t.Fatalf("want ace: %s", stderr)
	}
	info := func() uint64 {
		t.Helper()
		i, err := c.stream.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return i.State.Msgs
	}
	before := info()
	verbs := [][]string{
		{"pause", "ghostnode", "--by", "x"},
		{"resume", "ghostnode", "--by", "x"},
		{"poke", "ghostnode", "--by", "x"},
		{"retire", "ghostnode", "--by", "x"},
		{"revoke", "ghostnode", "nats", "img:2", "--by", "x"},
		{"waive", "ghostnode", "app", "/etc/app/key", "--by", "x"},
		{"pause", "ace", "ghostnode", "--by", "x"}, // one good name does not carry the other
	}
	for _, args := range verbs {
		code, _, stderr := c.run(t, "", args...)
		why := "node ghostnode has no want"
		if args[0] == "pause" || args[0] == "resume" { // a node the stream knows may be paused
			why = "node ghostnode has no event"
		}
		if code != exitUsage || !strings.Contains(stderr, why) || !strings.Contains(stderr, "meshfold fleet") {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
		}
	}
	if n := info(); n != before {
		t.Errorf("refused verbs published %d events", n-before)
	}
	for _, args := range verbs[:6] {
		code, stdout, stderr := c.run(t, "", append(args, "--new")...)
		if code != 0 || !strings.Contains(stdout, args[0]+" ghostnode: stream sequence") {
			t.Errorf("%v --new: exit %d, %q %q", args, code, stdout, stderr)
		}
	}
	// approve of a node with no event at all is refused too (issue 25: a
	// typo makes no node); --new approves ahead of the node's first want.
	code, _, stderr := c.run(t, "", "approve", "novox", "nats", "img:2", "--by", "x")
	if code != exitUsage || !strings.Contains(stderr, "node novox has no event") ||
		!strings.Contains(stderr, "to approve ahead of a new node's first want and first connection, give --new") {
		t.Errorf("approve of a node with no event: exit %d, stderr %q", code, stderr)
	}
	// docs/operations.md shows this refusal as it is.
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	shown := strings.NewReplacer("novox", "newbie", "img:2", "img:2.10", "stream "+c.cfg.Name, "stream MESH").Replace(strings.TrimSpace(stderr))
	if !strings.Contains(string(doc), "\n"+shown+"\n") {
		t.Errorf("docs/operations.md does not show approve's refusal as it is:\n%s", shown)
	}
	code, _, stderr = c.run(t, "", "approve", "novox", "nats", "img:2", "--by", "x", "--new")
	if code != 0 || !strings.Contains(stderr, "node novox has no want yet") {
		t.Errorf("approve of a node with no want: exit %d, stderr %q", code, stderr)
	}
}

// A node the stream knows but that has no want yet (its agent started)
// can be paused and resumed, so that its first want waits: it was refused
// as a mistyped name (a fresh user's finding). The other verbs still
// refuse it, saying it has no want; pause still refuses a name the stream
// holds nothing of, saying so.
func TestPauseANodeWithNoWant(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	pub := store.NewPublisher(c.js, c.cfg.Subjects())
	if _, err := pub.Append(context.Background(), "fresh", events.Stamp(&events.Agent{State: events.AgentUp, Claim: "c1"}, time.Now())); err != nil {
		t.Fatal(err)
	}
	for _, verb := range []string{"pause", "resume"} {
		code, stdout, stderr := c.run(t, "", verb, "fresh", "--by", "alice")
		if code != 0 || !strings.Contains(stdout, verb+" fresh: stream sequence") {
			t.Errorf("%s of a node with an agent and no want: exit %d, %q %q", verb, code, stdout, stderr)
		}
		if _, ok := c.last(t, "fresh", events.Kind(verb)); !ok {
			t.Errorf("%s fresh: no %s stored", verb, verb)
		}
	}
	// approve refuses it (no want names the module) unless --ahead, then
	// takes it with a note (an approval may come before the want).
	if code, _, stderr := c.run(t, "", "approve", "fresh", "nats", "img:2", "--by", "alice"); code != exitUsage || !strings.Contains(stderr, "node fresh has no want yet") {
		t.Errorf("approve of a node with an agent and no want: exit %d, %q", code, stderr)
	}
	if code, _, stderr := c.run(t, "", "approve", "fresh", "nats", "img:2", "--by", "alice", "--ahead"); code != 0 || !strings.Contains(stderr, "note: node fresh has no want yet") {
		t.Errorf("approve --ahead of a node with an agent and no want: exit %d, %q", code, stderr)
	}
	if code, _, stderr := c.run(t, "", "poke", "fresh", "--by", "alice"); code != exitUsage || !strings.Contains(stderr, "node fresh has no want") {
		t.Errorf("poke of a node with no want: exit %d, %q", code, stderr)
	}
	if code, _, stderr := c.run(t, "", "pause", "zed", "--by", "alice"); code != exitUsage || !strings.Contains(stderr, "node zed has no event in stream") || strings.Contains(stderr, "no want") {
		t.Errorf("pause of a node the stream holds nothing of: exit %d, %q", code, stderr)
	}
}

// --all and a list of nodes publish one event per node, each reported;
// completion offers the stream's nodes.
func TestOperatorVerbsManyNodes(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	for _, n := range []string{"ace", "shanks"} {
		if code, _, stderr := c.run(t, "", "want", n, "--new", "-f", writeWantFile(t, goodWant)); code != 0 {
			t.Fatalf("want %s: %s", n, stderr)
		}
	}
	// A node with an event but no want: --all leaves it out.
	if code, _, stderr := c.run(t, "", "approve", "novox", "nats", "img:2", "--by", "alice", "--new"); code != 0 {
		t.Fatalf("approve novox: %s", stderr)
	}
	code, stdout, stderr := c.run(t, "", "pause", "--all", "--by", "alice")
	if code != 0 {
		t.Fatalf("pause --all: exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "pause ace: stream sequence ") || !strings.HasPrefix(lines[1], "pause shanks: stream sequence ") {
		t.Errorf("pause --all printed %q", stdout)
	}
	for _, n := range []string{"ace", "shanks"} {
		if _, ok := c.last(t, n, events.KindPause); !ok {
			t.Errorf("no pause of %s", n)
		}
	}
	if _, ok := c.last(t, "novox", events.KindPause); ok {
		t.Error("--all paused novox, which has no want")
	}
	code, stdout, stderr = c.run(t, "", "approve", "ace", "shanks", "nats", "img:3", "--by", "bob", "--ahead")
	if code != 0 || strings.Count(stdout, "stream sequence") != 2 {
		t.Fatalf("approve two nodes: exit %d %q %q", code, stdout, stderr)
	}
	for _, n := range []string{"ace", "shanks"} {
		m, ok := c.last(t, n, events.KindApprove)
		if !ok || m.Event.Payload.(*events.Approve).Build != "img:3" {
			t.Errorf("approve of %s: %+v", n, m.Event)
		}
	}
	code, stdout, _ = c.run(t, "", "poke", "ace", "shanks", "--by", "bob")
	if code != 0 || strings.Count(stdout, "poke ") != 2 {
		t.Errorf("poke two nodes: exit %d %q", code, stdout)
	}

	// Completion: node names from the stream, those already given left
	// out; the flags that pick the server are honoured.
	complete := func(args ...string) []string {
		t.Helper()
		var out, errb strings.Builder
		// The word being completed comes last: the server flag first.
		all := append([]string{"__complete", args[0], "-s", c.url}, args[1:]...)
		if code := run(context.Background(), all, strings.NewReader(""), &out, &errb); code != 0 {
			t.Fatalf("__complete %v: exit %d: %s", args, code, errb.String())
		}
		return completions(out.String())
	}
	if got := complete("pause", "ace", ""); strings.Join(got, " ") != "novox shanks" {
		t.Errorf("complete pause ace ⇥ = %v", got)
	}
	if got := complete("state", "s"); strings.Join(got, " ") != "shanks" {
		t.Errorf("complete state s⇥ = %v", got)
	}
	if got := complete("waive", "ace", ""); len(got) != 0 {
		t.Errorf("complete waive ace ⇥ (a module) = %v", got)
	}
	if got := complete("approve", ""); strings.Join(got, " ") != "ace novox shanks" {
		t.Errorf("complete approve ⇥ = %v", got)
	}
}

// completions reads cobra's __complete output: one completion a line, then
// ":<directive>"; the required flags cobra offers too (--by) are left out.
func completions(out string) []string {
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l != "" && !strings.HasPrefix(l, ":") && !strings.HasPrefix(l, "--") && !strings.HasPrefix(l, "Completion ended") {
			got = append(got, l)
		}
	}
	return got
}

// The operator's whole loop against a live reconciler, as
// docs/operations.md shows it: pause, a new want shown pending in state,
// the dry run, resume and exactly one new plan; poke and its knock; waive
// an owed file; retire.
func TestOperatorFlow(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	ctx := testCtx(t)
	r := m.serveReconciler(t)
	stream, err := m.js.Stream(ctx, m.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	subj := m.cfg.Subjects()
	cli := func(args ...string) string {
		t.Helper()
		out, errOut, code := m.cli(t, args...)
		if code != 0 {
			t.Fatalf("meshfold %s: exit %d: %s", strings.Join(args, " "), code, errOut)
		}
		return out
	}
	// folded waits until the reconciler has folded ace through last, the
	// sequence of the input just published (a deadline, never a sleep;
	// the reconciler does not fold its own knocks and journals).
	// The last plan emitted, once its own event is folded back, has its
	// sequence.
	folded := func(last uint64) *reconcile.State {
		t.Helper()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			if st, ok := r.Node("ace"); ok && st.Seq >= last && (st.Emitted() == nil || st.Emitted().Seq != 0) {
				return st
			}
			select {
			case <-ctx.Done():
				t.Fatalf("the reconciler did not fold ace through #%d", last)
			case <-tick.C:
			}
		}
	}
	plans := func() int {
		t.Helper()
		n := 0
		err := store.ReadNode(ctx, m.js, m.cfg.Name, subj, "ace", 0, 0, func(msg store.Msg) error {
			if msg.Event.Kind == events.KindPlan {
				n++
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	v1 := writeWantFile(t, goodWant)
	v2 := writeWantFile(t, strings.ReplaceAll(goodWant, `"g:1"`, `"g:2"`))

	st := folded(printedSeq(t, cli("want", "ace", "--new", "-f", v1)))
	if plans() != 1 {
		t.Fatalf("one want, %d plans", plans())
	}
	settle := func() {
		t.Helper()
		e := st.Emitted()
		pub := store.NewPublisher(m.js, subj)
		ack, err := pub.Append(ctx, "ace", events.Stamp(&events.Settle{Module: "mesh-build-go", Op: events.OpApply, Plan: e.Seq}, time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		st = folded(ack.Seq)
	}
	settle()

	// Pause; a new want is taken in and shown pending; no plan.
	folded(printedSeq(t, cli("pause", "ace", "--by", "alice", "--reason", "disk swap")))
	wantOut := cli("want", "ace", "--new", "-f", v2)
	st = folded(printedSeq(t, wantOut))
	if plans() != 1 || st.Want.Seq != printedSeq(t, wantOut) {
		t.Fatalf("paused: %d plans, want #%d", plans(), st.Want.Seq)
	}
	out := cli("state", "ace")
	for _, w := range []string{"paused    by alice", "disk swap", "withheld", "mesh-build-go: build g:1 → g:2"} {
		if !strings.Contains(out, w) {
			t.Errorf("state of a paused node lacks %q:\n%s", w, out)
		}
	}
	// The dry run of a third want: computed from the reconciler's state,
	// the sequence to pin, nothing published.
	before, _ := store.StreamLastSeq(ctx, stream)
	out = cli("want", "ace", "--new", "-f", v1, "--dry-run")
	for _, w := range []string{fmt.Sprintf("folded through #%d, from the reconciler (live)", st.Seq),
		fmt.Sprintf("--expect %d", st.Want.Seq), "no plan yet: the node is paused (by alice", "nothing was published"} {
		if !strings.Contains(out, w) {
			t.Errorf("dry run lacks %q:\n%s", w, out)
		}
	}
	out = cli("want", "ace", "--new", "-f", v1, "--dry-run", "-o", "json")
	var dr dryRunReply
	if err := json.Unmarshal([]byte(out), &dr); err != nil || dr.Source != query.SourceReconciler || dr.DryRun.Seq != st.Seq || dr.DryRun.Publish || len(dr.DryRun.Modules) != 2 {
		t.Errorf("dry run json: %v %+v", err, dr)
	}
	if after, _ := store.StreamLastSeq(ctx, stream); after != before {
		t.Errorf("a dry run published: #%d → #%d", before, after)
	}

	// Resume: exactly one new plan, of the newest want.
	st = folded(printedSeq(t, cli("resume", "ace", "--by", "alice")))
	if n := plans(); n != 2 {
		t.Fatalf("after resume: %d plans, want 2", n)
	}
	if e := st.Emitted(); e.Want != st.Want.Seq || e.Modules[1].Build != "g:2" {
		t.Errorf("resumed plan %+v", e)
	}
	settle()

	// Poke: a knock with reason operator.
	poke := printedSeq(t, cli("poke", "ace", "--by", "bob"))
	folded(poke)
	// The knock is published after the fold: wait for it (a deadline).
	var k store.Msg
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for k.Event.Seq <= poke {
		k, err = store.LastMsg(ctx, stream, subj, "ace", events.KindKnock)
		if err != nil && !errors.Is(err, store.ErrNoMessage) {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatal("no knock after the poke")
		case <-tick.C:
		}
	}
	if kn := k.Event.Payload.(*events.Knock); len(kn.Reasons) != 1 || kn.Reasons[0] != events.KnockOperator {
		t.Errorf("poke's knock: %+v", kn)
	}

	// Waive a bogus owed file.
	pub := store.NewPublisher(m.js, subj)
	ack, err := pub.Append(ctx, "ace", events.Stamp(&events.Refusal{Module: "mesh-build-go", Path: "/run/mesh-build-go/old.creds",
		Reason: events.ReasonUndeclared, Plan: st.Settled.Seq, Writer: "prov"}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if st = folded(ack.Seq); len(st.Owed) != 1 {
		t.Fatalf("owed %v", st.Owed)
	}
	out, errOut, code := m.cli(t, "waive", "ace", "mesh-build-go", "/run/mesh-build-go/old.creds", "--by", "carol")
	if code != 0 || strings.Contains(errOut, "note:") {
		t.Fatalf("waive of an owed file: exit %d, stderr %q", code, errOut)
	}
	if st = folded(printedSeq(t, out)); len(st.Owed) != 0 {
		t.Errorf("after waive, owed %v", st.Owed)
	}
	// A second waive of it pays nothing, and neither the want nor the
	// plan declares the file: refused (exit 2); --ahead publishes it, with
	// a note.
	if _, errOut, code = m.cli(t, "waive", "ace", "mesh-build-go", "/run/mesh-build-go/old.creds", "--by", "carol"); code != exitUsage ||
		!strings.Contains(errOut, "declares no file /run/mesh-build-go/old.creds for module mesh-build-go") {
		t.Errorf("waive of a file nothing owes or declares: exit %d, stderr %q", code, errOut)
	}
	out, errOut, code = m.cli(t, "waive", "ace", "mesh-build-go", "/run/mesh-build-go/old.creds", "--by", "carol", "--ahead")
	if code != 0 || !strings.Contains(errOut, `note: nothing is owed for "mesh-build-go"'s "/run/mesh-build-go/old.creds" on ace`) {
		t.Errorf("waive of a file nothing is owed for: exit %d, stderr %q", code, errOut)
	}
	folded(printedSeq(t, out))
	// A waive --ahead of a path or module the plan never declared says
	// so; a revoke of a module the node never had too (both publish).
	out, errOut, code = m.cli(t, "waive", "ace", "mesh-build-go", "/nope", "--by", "carol", "--ahead")
	if code != 0 || !strings.Contains(errOut, `declares no file "/nope" for "mesh-build-go" (mistyped?)`) {
		t.Errorf("waive of an undeclared path: exit %d, stderr %q", code, errOut)
	}
	folded(printedSeq(t, out))
	out, errOut, code = m.cli(t, "waive", "ace", "mesh-buidl-go", "/nope", "--by", "carol", "--ahead")
	if code != 0 || !strings.Contains(errOut, `has no module "mesh-buidl-go" (mistyped?)`) {
		t.Errorf("waive of an unknown module: exit %d, stderr %q", code, errOut)
	}
	folded(printedSeq(t, out))
	// A revoke of a module the want does not name is refused (exit 2), as
	// an approval is; --ahead publishes it, with the note.
	if _, errOut, code = m.cli(t, "revoke", "ace", "wbe", "img:x", "--by", "carol"); code != exitUsage || !strings.Contains(errOut, "declares no module wbe") {
		t.Errorf("revoke of a module the want does not name: exit %d, stderr %q", code, errOut)
	}
	out, errOut, code = m.cli(t, "revoke", "ace", "wbe", "img:x", "--by", "carol", "--ahead")
	if code != 0 || !strings.Contains(errOut, `note: ace's newest plan (#`) || !strings.Contains(errOut, `has no module "wbe" (mistyped?`) {
		t.Errorf("revoke --ahead of a module the node never had: exit %d, stderr %q", code, errOut)
	}
	folded(printedSeq(t, out))

	// Retire: an empty plan; retired once it settles.
	st = folded(printedSeq(t, cli("retire", "ace", "--by", "dave")))
	if e := st.Emitted(); len(e.Modules) != 0 || st.Retire == nil || st.Retire.Retired {
		t.Fatalf("retiring: plan %+v retire %+v", e, st.Retire)
	}
	settle()
	if !st.Retire.Retired {
		t.Errorf("the empty plan settled and ace is not retired: %+v", st.Retire)
	}
}

// fleet leaves retired nodes out and --all lists them; a paused node says
// by whom; -o yaml prints one document per node with the JSON's field
// names; state -o yaml likewise.
func TestFleetRetiredAndYAML(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	ctx := testCtx(t)
	snaps, err := store.OpenSnapshots(ctx, m.js, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := reconciletest.New(time.Now().Add(-time.Minute), time.Millisecond)
	w := &events.Want{Modules: []events.WantModule{{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true}}}
	for _, n := range []string{"gone", "held", "calm"} {
		s.Append(n, w)
		s.Append(n, &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: s.State(n).Emitted().Seq})
		s.Append(n, &events.Have{})
	}
	s.Append("gone", &events.Retire{By: "alice", Force: true})
	s.Append("held", &events.Pause{By: "bob", Reason: "disk swap"})
	for _, n := range []string{"gone", "held", "calm"} {
		data, _ := json.Marshal(s.State(n))
		if err := snaps.PutNode(ctx, events.Partition(n, m.cfg.Partitions), n, data); err != nil {
			t.Fatal(err)
		}
	}
	out, errOut, code := m.cli(t, "fleet", "--warnings", "0")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if strings.Contains(out, "gone") || !strings.Contains(out, "-- 2 nodes, 1 needs an operator") ||
		!strings.Contains(out, "held paused by bob since") || !strings.Contains(out, "reason: disk swap") {
		t.Errorf("fleet:\n%s", out)
	}
	out, _, code = m.cli(t, "fleet", "--warnings", "0", "--all")
	if code != 0 || !strings.Contains(out, "gone ") || !strings.Contains(out, "-- 3 nodes") {
		t.Errorf("fleet --all:\n%s", out)
	}
	out, _, code = m.cli(t, "fleet", "--warnings", "0", "--all", "-o", "yaml")
	if code != 0 || strings.Count(out, "---\n") != 3 || !strings.Contains(out, "node: gone") || !strings.Contains(out, "retired: true") ||
		!strings.Contains(out, "by: bob") || !strings.Contains(out, "have_age_s:") {
		t.Errorf("fleet -o yaml:\n%s", out)
	}
	if _, errOut, code := m.cli(t, "fleet", "-o", "yaml", "--json"); code != exitUsage {
		t.Errorf("-o yaml --json: exit %d %s", code, errOut)
	}
	out, _, code = m.cli(t, "state", "held", "-o", "yaml", "--timeout", "100ms")
	if code != 0 || !strings.Contains(out, "source: snapshot") || !strings.Contains(out, "paused:") || !strings.Contains(out, "reason: disk swap") {
		t.Errorf("state -o yaml:\n%s", out)
	}
}

// A resume of a node that is not paused, or a pause of one paused
// already, publishes nothing, says so and exits 1, as the rollout verbs
// do (a fresh user's findings: a resume of nothing was published, then
// U17: exit 0, and a second pause was published); a node paused, or
// paused again after a retire, is resumed; --all resumes only the paused
// nodes and counts the others in one note, exit 1 only when none is.
func TestResumeOfANodeNotPaused(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	for _, n := range []string{"ace", "bob", "cat"} {
		if code, _, stderr := c.run(t, "", "want", n, "--new", "-f", writeWantFile(t, goodWant)); code != 0 {
			t.Fatalf("want %s: %s", n, stderr)
		}
	}
	msgs := func() uint64 {
		t.Helper()
		i, err := c.stream.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return i.State.Msgs
	}
	before := msgs()
	code, stdout, stderr := c.run(t, "", "resume", "bob", "--by", "alice")
	if code != exitError || strings.TrimSpace(stdout) != "resume bob: not paused: nothing published" ||
		!strings.Contains(stderr, "nothing published: the reconciler ignores a resume of a node not paused") {
		t.Errorf("resume of bob, not paused: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if n := msgs(); n != before {
		t.Errorf("resume of a node not paused published %d events", n-before)
	}
	if code, stdout, stderr = c.run(t, "", "resume", "--all", "--by", "alice"); code != exitError || stdout != "" ||
		!strings.Contains(stderr, "--all: no node is paused: nothing published") {
		t.Errorf("resume --all, none paused: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	// Paused: a second pause publishes nothing; resumed: a second resume
	// publishes nothing either.
	if code, _, stderr := c.run(t, "", "pause", "ace", "--by", "alice"); code != 0 {
		t.Fatalf("pause ace: %s", stderr)
	}
	pause, _ := c.last(t, "ace", events.KindPause)
	before = msgs()
	code, stdout, stderr = c.run(t, "", "pause", "ace", "--by", "bob")
	if code != exitError || strings.TrimSpace(stdout) != fmt.Sprintf("pause ace: paused already (pause #%d by alice): nothing published", pause.Event.Seq) {
		t.Errorf("a second pause of ace: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if n := msgs(); n != before {
		t.Errorf("a second pause published %d events", n-before)
	}
	if code, _, stderr := c.run(t, "", "resume", "ace", "--by", "alice"); code != 0 {
		t.Fatalf("resume ace: %s", stderr)
	}
	if code, stdout, _ := c.run(t, "", "resume", "ace", "--by", "alice"); code != exitError || !strings.Contains(stdout, "resume ace: not paused") {
		t.Errorf("a second resume of ace: exit %d, %q", code, stdout)
	}
	// Named together: the paused one is resumed, the other said, exit 1.
	if code, _, stderr := c.run(t, "", "pause", "cat", "--by", "alice"); code != 0 {
		t.Fatal(stderr)
	}
	code, stdout, stderr = c.run(t, "", "resume", "bob", "cat", "--by", "alice")
	if code != exitError || !strings.Contains(stdout, "resume bob: not paused: nothing published") || !strings.Contains(stdout, "resume cat: stream sequence ") ||
		!strings.Contains(stderr, "1 of 2 nodes not paused: nothing published to it") {
		t.Errorf("resume bob cat: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if _, ok := c.last(t, "bob", events.KindResume); ok {
		t.Error("bob, never paused, got a resume")
	}
	// --all: only the paused nodes get one, exit 0.
	if code, _, stderr := c.run(t, "", "pause", "bob", "--by", "alice"); code != 0 {
		t.Fatal(stderr)
	}
	code, stdout, stderr = c.run(t, "", "resume", "--all", "--by", "alice")
	if code != 0 || strings.TrimSpace(stdout) != "resume bob: stream sequence "+fmt.Sprint(msgs()) ||
		!strings.Contains(stderr, "--all skipped 2 nodes not paused (ace, cat): nothing published to them") {
		t.Errorf("resume --all: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	// pause --all: the paused one skipped; all paused: exit 1.
	if code, _, stderr := c.run(t, "", "pause", "ace", "--by", "alice"); code != 0 {
		t.Fatal(stderr)
	}
	code, stdout, stderr = c.run(t, "", "pause", "--all", "--by", "alice")
	if code != 0 || strings.Count(stdout, "stream sequence") != 2 || !strings.Contains(stderr, "--all skipped 1 node paused already (ace)") {
		t.Errorf("pause --all: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if code, _, stderr = c.run(t, "", "pause", "--all", "--by", "alice"); code != exitError || !strings.Contains(stderr, "every node is paused already") {
		t.Errorf("pause --all, all paused: exit %d, stderr %q", code, stderr)
	}
}
