package main

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
)

// startHave waits for the new agent's have reporting r's file gone at
// its start, and returns it with the claim of the agent's up.
func (r *refillMesh) startHave(t *testing.T) (events.Event, string) {
	t.Helper()
	var have events.Event
	waitKind(t, r.s.m, events.KindHave, func(ev events.Event) bool {
		h := ev.Payload.(*events.Have)
		have = ev
		return ev.Seq > r.last && slices.Contains(h.Missing, events.MissingFile{Module: "app", Path: r.path, AtStart: true})
	})
	var claim string
	waitKind(t, r.s.m, events.KindAgent, func(ev events.Event) bool {
		a := ev.Payload.(*events.Agent)
		claim = a.Claim
		return ev.Seq > r.last && a.State == events.AgentUp
	})
	if s := have.Payload.(*events.Have).Started; s != claim {
		t.Fatalf("have #%d names the claim %q, the agent's up %q", have.Seq, s, claim)
	}
	return have, claim
}

// waitState waits for `state ace` to say want, and returns what it said.
func (r *refillMesh) waitState(t *testing.T, what, want string) string {
	t.Helper()
	var said string
	waitfor.Until(t, time.Minute, what, func() bool {
		out, _, code := r.s.m.cli(t, "state", "ace")
		said = strings.Join(strings.Fields(out), " ")
		return code == 0 && strings.Contains(said, want)
	})
	return said
}

// A node reboots: its agent and its provisioner are killed -9 and /run
// is emptied (a tmpfs). The new agent reports the file gone at its start
// (its first settle's look, under its claim), `state` says so, and once
// the provisioner runs again the file is back, with exactly one knock for
// the agent's start (at its up, or at that have, whichever the
// reconciler folded first) and `state` clear. Real processes: meshfold as
// shipped runs the agent (its shims and modules, adopted across its
// restart) and the provisioner.
func TestFilesGoneAtAgentStart(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds meshfold and runs real processes: not in -short")
	}
	r := startRefillMesh(t)
	s := r.s
	kill9(t, s.prov)
	kill9(t, s.agent)
	r.emptyRun(t)
	r.last = lastSeq(t, s)
	s.agentStart()

	have, claim := r.startHave(t)
	said := r.waitState(t, "state saying the file gone at the agent's start",
		"declared file "+r.path+" of module app is missing on the node, gone at its agent's start (reported at #")
	if !strings.Contains(said, "gone at its agent's start (reported at #"+strconv.FormatUint(have.Seq, 10)+")") {
		t.Errorf("state names another have than #%d: %s", have.Seq, said)
	}

	s.prov, s.provErr = s.start("provision", "ace", "--from", filepath.Join(filepath.Dir(s.root), "secrets"), "--account", s.acct, "--resync", "0", "--log-level", "info")
	r.waitBack(t, "the credential filled again after the reboot")
	r.waitStateClear(t)
	knocks := r.knocksSince(t)
	if len(knocks) != 1 {
		t.Fatalf("%d knocks for the agent's start, want exactly 1: %v", len(knocks), knocks)
	}
	if k := knocks[0].Payload.(*events.Knock); !slices.Equal(k.Reasons, []events.KnockReason{events.KnockAgent}) &&
		!slices.Equal(k.Reasons, []events.KnockReason{events.KnockMissing}) {
		t.Errorf("the knock's reasons: %v, want agent or missing", k.Reasons)
	}
	assertNotStored(t, s.m.e.NATS().StoreDir(), [][]byte{r.secret})
	t.Logf("have #%d reported the file gone at the start of agent %s; knock #%d (%v)", have.Seq, claim, knocks[0].Seq,
		knocks[0].Payload.(*events.Knock).Reasons)
}

// The same reboot, where no source gives the file again (it was removed
// from the provisioner's directory): `state` says it is gone, at the
// agent's start, and why it is not filled again; `fleet` lists the node
// as missing a file, and says which. One knock.
func TestFilesGoneAtAgentStartNoSource(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds meshfold and runs real processes: not in -short")
	}
	r := startRefillMesh(t)
	s := r.s
	kill9(t, s.prov)
	kill9(t, s.agent)
	r.emptyRun(t)
	secrets := filepath.Join(filepath.Dir(s.root), "secrets")
	if err := os.Remove(filepath.Join(secrets, "app", r.path)); err != nil {
		t.Fatal(err)
	}
	r.last = lastSeq(t, s)
	s.agentStart()
	s.prov, s.provErr = s.start("provision", "ace", "--from", secrets, "--account", s.acct, "--resync", "0", "--log-level", "info")

	have, _ := r.startHave(t)
	r.waitState(t, "state saying why the file is not filled again",
		"app "+r.path+" gone from the node at its agent's start (reported at #"+strconv.FormatUint(have.Seq, 10)+"; last filled at ")
	said := r.waitState(t, "state saying the file gone at the agent's start",
		"declared file "+r.path+" of module app is missing on the node, gone at its agent's start (reported at #"+strconv.FormatUint(have.Seq, 10)+")")
	if !strings.Contains(said, "no source gives it again: missing") {
		t.Errorf("state does not say why it is not filled again: %s", said)
	}
	waitfor.Until(t, time.Minute, "fleet saying the file gone at the agent's start", func() bool {
		out, _, code := s.m.cli(t, "fleet")
		return code == 0 && strings.Contains(strings.Join(strings.Fields(out), " "),
			"missing ace declared file "+r.path+" of module app is missing on the node, gone at its agent's start (reported at #"+strconv.FormatUint(have.Seq, 10)+")")
	})
	if _, err := os.Stat(r.file); err == nil {
		t.Fatal("the file is on the node: no source was to give it")
	}
	out, _, _ := s.m.cli(t, "state", "ace")
	t.Logf("state ace:\n%s", out)
	if knocks := r.knocksSince(t); len(knocks) != 1 {
		t.Errorf("%d knocks for the agent's start, want exactly 1: %v", len(knocks), knocks)
	}
}

// The agent alone killed -9 and /run emptied while the provisioner runs:
// the agent-back knock (or the new agent's report, whichever is folded
// first) brings the file back at once, with exactly one knock; the new
// agent's have reported it gone at its start, which `audit` tells (the
// state's missing line lasts only until the fill's filled, milliseconds).
func TestFilesGoneAtAgentRestart(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds meshfold and runs real processes: not in -short")
	}
	r := startRefillMesh(t)
	s := r.s
	kill9(t, s.agent)
	r.emptyRun(t)
	r.last = lastSeq(t, s)
	began := time.Now()
	s.agentStart()
	r.waitBack(t, "the credential filled again after the agent's restart")
	back := time.Since(began)
	have, _ := r.startHave(t)
	r.waitStateClear(t)
	if knocks := r.knocksSince(t); len(knocks) != 1 {
		t.Fatalf("%d knocks for the agent's start, want exactly 1: %v", len(knocks), knocks)
	}
	// The table cuts a long line to its width: the JSON says it whole.
	out, errs, code := s.m.cli(t, "audit", "ace", "--since", strconv.FormatUint(have.Seq, 10), "--until", strconv.FormatUint(have.Seq, 10), "-o", "json")
	if code != 0 {
		t.Fatalf("audit: %d %s", code, errs)
	}
	if !strings.Contains(out, "missing on the node: app "+r.path+" (gone at the agent's start)") {
		t.Errorf("audit of have #%d does not say the file gone at the agent's start:\n%s", have.Seq, out)
	}
	t.Logf("agent restarted with /run emptied → credential back in %s; have #%d reported it gone at the start", back.Round(time.Millisecond), have.Seq)
}
