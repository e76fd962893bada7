package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
)

// TestPokeSaysNoProvisionerAnswered: a poke no provisioner takes says so
// after its wait, naming the command to look for; state and fleet show
// the unanswered knock as the node's source problem. Once a provisioner
// runs, the poke says it took the knock, and the problem is gone; killed,
// the next poke says when it last answered.
func TestPokeSaysNoProvisionerAnswered(t *testing.T) {
	// Not parallel: it sets audit.KnockGrace.
	m := startMesh(t)
	trust := m.serveSigned(t)
	grace := audit.KnockGrace
	audit.KnockGrace = 0 // state and fleet: a knock unanswered at once
	t.Cleanup(func() { audit.KnockGrace = grace })
	if _, errOut, code := m.cli(t, "want", "ace", "--new", "-f", writeWantFile(t, goodWant)); code != 0 {
		t.Fatalf("want: exit %d %s", code, errOut)
	}
	// The reconciler has folded the want: the poke's knock follows its
	// fold, within the poke's wait (a loaded machine took over a second
	// to fold the want itself).
	waitComposed(t, m, "ace")
	out, errOut, code := m.cli(t, "poke", "ace", "--by", "alice", "--wait", "3s")
	if code != 0 || !strings.HasPrefix(out, "poke ace: stream sequence") {
		t.Fatalf("poke: exit %d %q %q", code, out, errOut)
	}
	for _, s := range []string{"warning: poke ace: no provisioner answered within 3s (knock #", "is `meshfold provision ace …` running for ace?",
		"no provisioner of ace has recorded an answer"} {
		if !strings.Contains(errOut, s) {
			t.Errorf("poke with no provisioner: stderr does not say %q:\n%s", s, errOut)
		}
	}
	out, errOut, code = m.cli(t, "state", "ace")
	if code != 0 || !strings.Contains(out, "ace no-provisioner:") || !strings.Contains(out, "running for ace?") {
		t.Errorf("state: exit %d, it does not show the unanswered knock:\n%s%s", code, out, errOut)
	}
	out, errOut, code = m.cli(t, "fleet")
	if code != 0 || !strings.Contains(out, "ace no-provisioner:") || !strings.Contains(out, "source") {
		t.Errorf("fleet: exit %d, it does not show the unanswered knock:\n%s%s", code, out, errOut)
	}
	// fleet -o json (every line, streamed) says what the table says (a
	// fresh user's finding 2: it said "attention":[]), once ace's
	// snapshot holds the knock.
	jsonRow := func(what string, want func(audit.FleetRow) bool) {
		t.Helper()
		waitfor.Value(t, 20*time.Second, what, func() (audit.FleetRow, bool) {
			out, _, code := m.cli(t, "fleet", "-o", "json")
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				var r audit.FleetRow
				if code == 0 && json.Unmarshal([]byte(line), &r) == nil && r.Node == "ace" && r.LastKnockCause > 0 && want(r) {
					return r, true
				}
			}
			return audit.FleetRow{}, false
		})
	}
	jsonRow("fleet -o json: ace's unanswered knock as a source problem", func(r audit.FleetRow) bool {
		return slices.Contains(r.Attention, "source") && len(r.Sources) == 1 && r.Sources[0].State == audit.NoProvisioner
	})

	ctx, cancel := context.WithCancel(testCtx(t))
	logs := newNoteBuffer()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"provision", "ace", "--from", t.TempDir(), "--account", "prov", "--trust", trust, "-s", m.e.ClientURL()}, nil, logs, logs)
	}()
	logs.waitText(testCtx(t), t, "provision", "provisioner running")
	out, errOut, code = m.cli(t, "poke", "ace", "--by", "alice", "--wait", "1m")
	t.Logf("poke with a provisioner: %s", errOut)
	if code != 0 || !strings.Contains(errOut, "poke ace: its provisioner took knock #") || strings.Contains(errOut, "warning") {
		t.Errorf("poke with a provisioner: exit %d %q %q", code, out, errOut)
	}
	if out, errOut, code = m.cli(t, "state", "ace"); code != 0 || strings.Contains(out, "no-provisioner") {
		t.Errorf("state with a provisioner: exit %d:\n%s%s", code, out, errOut)
	}
	jsonRow("fleet -o json: ace's knock answered (its file has no source: the provisioner's own report)", func(r audit.FleetRow) bool {
		return !slices.ContainsFunc(r.Sources, func(p audit.SourceProblem) bool { return p.State == audit.NoProvisioner })
	})
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("provision exited %d:\n%s", code, logs.String())
	}
	// Stopped, its lease released: once the reconciler recorded it down,
	// poke says so at once (TestPokeSaysAProvisionerRecordedDownAtOnce);
	// before, after the wait, when it last answered.
	_, errOut, _ = m.cli(t, "poke", "ace", "--by", "alice", "--wait", "300ms")
	recorded := strings.Contains(errOut, "warning: poke ace: provisioner-down: no provisioner answered since ")
	if !recorded && (!strings.Contains(errOut, "no provisioner answered within 300ms") || !strings.Contains(errOut, "its provisioner last answered knock #") ||
		!strings.Contains(errOut, "as prov")) {
		t.Errorf("poke after the provisioner stopped: %q", errOut)
	}
	_, errOut, _ = m.cli(t, "poke", "ace", "--by", "alice", "--wait", "0")
	if strings.Contains(errOut, "provisioner") {
		t.Errorf("poke --wait 0 waited: %q", errOut)
	}
}

// A node whose plan declares no file needs no provisioner: a poke knocks
// it all the same (the fold knocks on every poke), but neither the poke
// nor state nor fleet says that no provisioner answered it, while a node
// whose plan declares a file still is flagged (reviewer's finding: every
// node without files showed NEEDS source after 'poke --all').
func TestPokeOfANodeWithNoFilesNeedsNoProvisioner(t *testing.T) {
	// Not parallel: it sets audit.KnockGrace.
	m := startMesh(t)
	m.serveSigned(t)
	grace := audit.KnockGrace
	audit.KnockGrace = 0 // state and fleet: a knock unanswered at once
	t.Cleanup(func() { audit.KnockGrace = grace })
	for node, want := range map[string]string{"ace": goodWant, "bob": `{"modules":[{"name":"web","build":"img:1","runs_as":"web"}]}`} {
		if _, errOut, code := m.cli(t, "want", node, "--new", "-f", writeWantFile(t, want)); code != 0 {
			t.Fatalf("want %s: exit %d %s", node, code, errOut)
		}
	}
	waitComposed(t, m, "ace", "bob")
	out, errOut, code := m.cli(t, "poke", "--all", "--by", "alice", "--wait", "3s")
	if code != 0 || strings.Count(out, "stream sequence") != 2 {
		t.Fatalf("poke --all: exit %d %q %q", code, out, errOut)
	}
	if !strings.Contains(errOut, "warning: poke ace: no provisioner answered") || strings.Contains(errOut, "warning: poke bob") ||
		!strings.Contains(errOut, "poke bob: no provisioner is needed: neither its newest plan nor its newest want declares a file to fill") ||
		!strings.Contains(errOut, "poke: waiting (up to 3s; --wait 0 does not) for the provisioner of ace to take the knock") {
		t.Errorf("poke --all: stderr:\n%s", errOut)
	}
	// Nothing to wait for: bob's answer comes at once, not after the wait
	// (a fresh user's finding: it came after 5 s).
	start := time.Now()
	out, errOut, code = m.cli(t, "poke", "bob", "--by", "alice", "--wait", "1m")
	if took := time.Since(start); code != 0 || took > 30*time.Second || strings.Contains(errOut, "waiting") ||
		!strings.Contains(errOut, "poke bob: no provisioner is needed") {
		t.Errorf("poke bob --wait 1m: exit %d after %s:\n%s%s", code, took, out, errOut)
	}
	// Both knocks are stored (poke read them): ace is flagged, bob never.
	waitfor.Until(t, 30*time.Second, "state and fleet to flag ace", func() bool {
		sa, _, ca := m.cli(t, "state", "ace")
		fl, _, cf := m.cli(t, "fleet")
		return ca == 0 && cf == 0 && strings.Contains(sa, "ace no-provisioner:") && strings.Contains(fl, "ace no-provisioner:")
	})
	if out, errOut, code = m.cli(t, "state", "bob"); code != 0 || strings.Contains(out, "no-provisioner") {
		t.Errorf("state bob: exit %d, it flags a node with no file to fill:\n%s%s", code, out, errOut)
	}
	if out, errOut, code = m.cli(t, "fleet"); code != 0 || strings.Contains(out, "bob no-provisioner") {
		t.Errorf("fleet: exit %d, it flags bob, which has no file to fill:\n%s%s", code, out, errOut)
	}
	// fleet -o json (streamed) applies the same rule: ace flagged once
	// its snapshot holds the knock, bob never (a fresh user's finding 2).
	rows := waitfor.Value(t, 30*time.Second, "fleet -o json to flag ace", func() (map[string]audit.FleetRow, bool) {
		out, _, code := m.cli(t, "fleet", "-o", "json")
		rows := map[string]audit.FleetRow{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var r audit.FleetRow
			if json.Unmarshal([]byte(line), &r) == nil {
				rows[r.Node] = r
			}
		}
		return rows, code == 0 && rows["ace"].LastKnockCause > 0 && rows["bob"].LastKnockCause > 0 && slices.Contains(rows["ace"].Attention, "source")
	})
	if slices.Contains(rows["bob"].Attention, "source") {
		t.Errorf("fleet -o json flags bob, which has no file to fill: %+v", rows["bob"])
	}
}

// waitComposed waits until the reconciler has composed a plan for each
// of nodes ('meshfold state' answers with its composition).
func waitComposed(t *testing.T, m *mesh, nodes ...string) {
	t.Helper()
	for _, n := range nodes {
		waitfor.Until(t, 30*time.Second, n+"'s plan composed", func() bool {
			out, _, code := m.cli(t, "state", n)
			return code == 0 && strings.Contains(out, "composed ")
		})
		// state says the reconciler's fold, whose plan is published
		// after it: a provisioner started before the plan is stored
		// finds none, and sees it only at its next knock, settle or
		// resync (TestUntrustedProvisionerSaid waited out its 2 min
		// under load so).
		ctx := testCtx(t)
		waitfor.Until(t, 30*time.Second, n+"'s plan stored", func() bool {
			_, err := store.LastMsg(ctx, store.Leader(m.js, m.cfg.Name), m.cfg.Subjects(), n, events.KindPlan)
			return err == nil
		})
	}
}

// A node whose provisioner is recorded down (provisioner-down: its lease
// ended, its plan declares a file) is said at once by poke, not after
// the wait: no provisioner will take the knock until one starts again.
func TestPokeSaysAProvisionerRecordedDownAtOnce(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	m.serveSigned(t)
	if _, errOut, code := m.cli(t, "want", "ace", "--new", "-f", writeWantFile(t, goodWant)); code != 0 {
		t.Fatalf("want: exit %d %s", code, errOut)
	}
	waitComposed(t, m, "ace")
	// The reconciler's liveness watch records a provisioner's end so;
	// here the event alone, as it would publish it.
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	for _, st := range []events.AgentState{events.AgentUp, events.AgentDown} {
		p := &events.Prov{Agent: events.Agent{State: st, Claim: "c1", Host: "h", PID: 42}}
		if st == events.AgentDown {
			p.Why = events.WhyExpired
		}
		if _, err := pub.Append(testCtx(t), "ace", events.Stamp(p, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	waitfor.Until(t, 30*time.Second, "state to say ace's provisioner is down", func() bool {
		out, _, code := m.cli(t, "state", "ace")
		return code == 0 && strings.Contains(out, "prov      DOWN since")
	})
	start := time.Now()
	out, errOut, code := m.cli(t, "poke", "ace", "--by", "alice", "--wait", "1m")
	if took := time.Since(start); code != 0 || took > 30*time.Second || strings.Contains(errOut, "waiting") ||
		!strings.Contains(errOut, "warning: poke ace: provisioner-down: no provisioner answered since ") ||
		!strings.Contains(errOut, "until `meshfold provision ace …` runs again") {
		t.Errorf("poke ace --wait 1m: exit %d after %s:\n%s%s", code, took, out, errOut)
	}
}

// TestPokeSaysNoSharedWaitAsEachNodesTime: the time poke waited for
// several nodes' provisioners is one wait for all (answers stored before
// its watch are seen at once), so it is said once, for the batch, and no
// node's line carries it as its own (a fresh user's finding m2: 'poke
// --all' said "in 487ms" for each of 8 nodes). One node's line says
// within how long.
func TestPokeSaysNoSharedWaitAsEachNodesTime(t *testing.T) {
	answers := map[string]store.KnockAnswer{"n01": {Knock: 331}, "n02": {Knock: 333}, "n03": {Knock: 335}}
	took := map[string]time.Duration{"n01": 487 * time.Millisecond, "n02": 487 * time.Millisecond, "n03": 512 * time.Millisecond}
	var b strings.Builder
	missing := sayKnocksTaken(&b, []string{"n01", "n02", "n03", "n04"}, answers, took)
	want := "poke n01: its provisioner took knock #331\n" +
		"poke n02: its provisioner took knock #333\n" +
		"poke n03: its provisioner took knock #335\n" +
		"poke: 3 of 4 provisioners took their knocks, all within 512ms of the pokes (one wait for all: no figure of each)\n"
	if b.String() != want || !slices.Equal(missing, []string{"n04"}) {
		t.Errorf("several nodes: missing %v, said:\n%s\nwant:\n%s", missing, b.String(), want)
	}
	b.Reset()
	missing = sayKnocksTaken(&b, []string{"n01"}, answers, took)
	if want := "poke n01: its provisioner took knock #331 within 487ms of the poke\n"; b.String() != want || len(missing) != 0 {
		t.Errorf("one node: missing %v, said %q, want %q", missing, b.String(), want)
	}
}
