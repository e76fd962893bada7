package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
	"github.com/meshfold/meshfold/store"
)

// heldState is novox with nats held for an approval and an owed item.
func heldState(t testing.TB) *reconcile.State {
	s := reconciletest.New(time.Now().Add(-time.Hour), time.Second)
	s.Append("novox", &events.Want{Modules: []events.WantModule{
		{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		{Name: "nats", Build: "n:2.11", RunsAs: "nats", RequiresApproval: true, Files: []events.File{{Path: "/etc/nats/nats.creds", Mode: "0600"}}},
	}})
	s.Append("novox", &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: 2})
	s.Append("novox", &events.Refusal{Module: "postgres", Path: "/etc/pg.creds", Reason: events.ReasonUndeclared, Plan: 2, Writer: "prov"})
	s.Append("novox", &events.Have{Modules: []events.HaveModule{{Name: "provisioner", Build: "p:1", State: events.Running, Account: "prov"}}})
	return s.State("novox")
}

func TestStateCommand(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	st := heldState(t)
	svc, err := engine.AddStateService(m.nc, func(node string) (*reconcile.State, bool) {
		if node != "novox" {
			return nil, false
		}
		return st.Clone(), true
	}, engine.StateServiceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	// The CLI connects anew: the service's subscriptions must be on the
	// server first, or under load it finds no responder.
	if err := m.nc.Flush(); err != nil {
		t.Fatal(err)
	}

	out, errOut, code := m.cli(t, "state", "novox")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"novox: folded through #5, from the reconciler (live)",
		"account   plan names prov, what runs names prov", "counts    2 modules, 0 declared files, 1 held",
		"held      nats: nothing runs until n:2.11 is approved", "owed      postgres /etc/pg.creds (undeclared, plan #2, writer prov)",
		"plan      last emitted #2, last settled #2, 0 unsettled", "have      #5 at "} {
		if !strings.Contains(out, want) {
			t.Errorf("state lacks %q:\n%s", want, out)
		}
	}
	out, _, code = m.cli(t, "state", "novox", "--json")
	var r stateReply
	if code != 0 || json.Unmarshal([]byte(out), &r) != nil || r.Source != "reconciler" || r.View.Held != 1 || len(r.Composition.Modules) != 2 {
		t.Errorf("--json: exit %d\n%s", code, out)
	}
	if _, errOut, code := m.cli(t, "state", "zed"); code != exitUsage || !strings.Contains(errOut, `node "zed" is unknown: the reconciler has folded no event of it`) {
		t.Errorf("unknown node via the service: exit %d %q", code, errOut)
	}

	// The reconciler goes away: the snapshot answers, and says so.
	if err := svc.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := m.cli(t, "state", "novox"); code != exitUsage || !strings.Contains(errOut, "no snapshots yet") {
		t.Errorf("no bucket: exit %d %q", code, errOut)
	}
	ctx := testCtx(t)
	snaps, err := store.OpenSnapshots(ctx, m.js, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(st)
	if err := snaps.PutNode(ctx, events.Partition("novox", m.cfg.Partitions), "novox", data); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = m.cli(t, "state", "novox", "--timeout", "100ms")
	if code != 0 || !strings.Contains(out, "from the stored snapshot: no reconciler answered") || !strings.Contains(out, "until n:2.11 is approved") {
		t.Errorf("snapshot: exit %d %s\n%s", code, errOut, out)
	}
	out, _, code = m.cli(t, "state", "novox", "--json")
	if code != 0 || json.Unmarshal([]byte(out), &r) != nil || r.Source != "snapshot" || r.View.Seq != 5 {
		t.Errorf("snapshot --json: exit %d\n%s", code, out)
	}
	if _, errOut, code := m.cli(t, "state", "zed"); code != exitUsage || !strings.Contains(errOut, `node "zed" is unknown: no reconciler answered and no snapshot holds it`) {
		t.Errorf("unknown node via the snapshot: exit %d %q", code, errOut)
	}
	if _, _, code := m.cli(t, "state", "Bad!"); code != exitUsage {
		t.Errorf("bad name: exit %d", code)
	}
}

func TestFleetCommand(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	ctx := testCtx(t)
	snaps, err := store.OpenSnapshots(ctx, m.js, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	// calm: settled, a fresh have.
	s := reconciletest.New(time.Now().Add(-time.Minute), time.Millisecond)
	s.Append("calm", &events.Want{Modules: []events.WantModule{{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true}}})
	s.Append("calm", &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: 2})
	s.Append("calm", &events.Have{})
	put := func(st *reconcile.State) {
		data, _ := json.Marshal(st)
		if err := snaps.PutNode(ctx, events.Partition(st.Node, m.cfg.Partitions), st.Node, data); err != nil {
			t.Fatal(err)
		}
	}
	put(s.State("calm"))
	put(heldState(t))
	if err := snaps.PutNode(ctx, 0, "broken", []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	// A journal warning of calm's, on the stream, after its settled plan
	// (#2 in its snapshot): one older would have cleared (issue 25).
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	for range 3 {
		if _, err := pub.Append(ctx, "filler", events.Stamp(&events.Journal{Level: events.LevelInfo, Msg: "i", Cause: 1}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pub.Append(ctx, "calm", events.Stamp(&events.Journal{Level: events.LevelWarn, Msg: "w", Cause: 1}, time.Now())); err != nil {
		t.Fatal(err)
	}

	// An entry of the fleet-wide journal is said on stderr.
	if _, err := pub.Append(ctx, events.FleetNode, events.Stamp(&events.Journal{Level: events.LevelError, Msg: "1 event(s) on subjects that name no valid node", Cause: 1}, time.Now())); err != nil {
		t.Fatal(err)
	}

	out, errOut, code := m.cli(t, "fleet")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(errOut, "fleet journal (mesh._fleet.journal) has 1 entry at warn or error in the last 1h0m0s: meshfold audit cannot show it") {
		t.Errorf("stderr does not tell the fleet journal's entry: %q", errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	// The table, its count line, how current it is, what the stream
	// keeps, and a line naming calm's warning (a flag with no line saying
	// what it is told nothing).
	if len(lines) != 8 || !strings.HasPrefix(lines[0], "NODE") || !strings.HasPrefix(lines[1], "broken ") ||
		!strings.HasPrefix(lines[2], "novox ") || !strings.HasPrefix(lines[3], "calm ") {
		t.Fatalf("fleet:\n%s", out)
	}
	if !strings.Contains(lines[2], "owed, approve nats→n:2.11") || !strings.Contains(lines[3], "1 warning") {
		t.Errorf("needs:\n%s", out)
	}
	if lines[6] != "-- stream MESH keeps all events" {
		t.Errorf("the stream's retention is not said after the table:\n%s", out)
	}
	if !regexp.MustCompile(`^journal +calm #\d+ warn: w$`).MatchString(lines[7]) {
		t.Errorf("the warning is not named after the table:\n%s", out)
	}
	out, _, code = m.cli(t, "fleet", "--json", "--warnings", "0")
	if code != 0 {
		t.Fatal(out)
	}
	var nodes []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var r struct {
			Node     string `json:"node"`
			Warnings int    `json:"journal_warnings"`
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, r.Node)
		if r.Warnings != -1 {
			t.Errorf("%s: warnings %d with --warnings 0, want -1 (not counted)", r.Node, r.Warnings)
		}
	}
	if strings.Join(nodes, " ") != "broken novox calm" {
		t.Errorf("json order %v", nodes)
	}
}
