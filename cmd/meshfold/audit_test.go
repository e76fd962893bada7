package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
)

// TestAuditAsOfEqualsLive: a scripted history of several hundred events
// across three nodes is published to a real stream; for every sequence S,
// the state `meshfold audit NODE --as-of S` computes equals the state the
// live fold held right after S. Every node at every S goes through the
// read and replay the CLI does, in process (query.Reader.History,
// History.AsOf); the CLI itself runs for the node of every seventh event
// and of the last (each run connects and reads the node's history anew:
// run for all 330 it was 212 s of the suite under -race on a loaded
// machine, the same code path each time).
func TestAuditAsOfEqualsLive(t *testing.T) {
	t.Parallel()
	nodes := []string{"ace", "shanks", "novox"}
	live := map[uint64]map[string][]byte{}
	last := map[string][]byte{}
	s := reconciletest.Scripted(nodes, 330, 42, func(ev events.Event, st *reconcile.State) {
		b, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		last[ev.Node] = b
		cp := make(map[string][]byte, len(last))
		for n, v := range last {
			cp[n] = v
		}
		live[ev.Seq] = cp
	})
	if len(s.Events) < 300 {
		t.Fatalf("only %d events", len(s.Events))
	}
	m := startMesh(t)
	m.publish(t, s)
	ctx := testCtx(t)
	r := m.reader(t)

	// The stream stamps its own times: a have's time in the state is the
	// stream's. Compare the rest with the live fold, and that time with
	// the stream's timestamp of the have.
	streamTime := map[uint64]time.Time{}
	seqAt := map[int64]uint64{} // a crash keeps its have's time only
	histories := map[string]*audit.History{}
	for _, node := range nodes {
		h, err := r.History(ctx, node, query.Bounds{})
		if err != nil {
			t.Fatal(err)
		}
		histories[node] = h
		for _, ev := range h.Events {
			streamTime[ev.Seq] = ev.Time
			seqAt[ev.Time.UnixNano()] = ev.Seq
		}
	}
	check := func(how, node string, seq uint64, st *reconcile.State) {
		t.Helper()
		// Every time the state keeps is the stream time of the event at
		// the sequence beside it.
		restamp := func(what string, at *time.Time, of uint64) {
			t.Helper()
			if !at.Equal(streamTime[of]) {
				t.Fatalf("%s %s as of #%d: %s time %v, stream says %v of #%d", how, node, seq, what, *at, streamTime[of], of)
			}
			*at = s.TimeOf(of)
		}
		if st.Have != nil {
			restamp("have", &st.Have.Time, st.Have.Seq)
		}
		for i := range st.Owed {
			restamp("owed item", &st.Owed[i].Time, st.Owed[i].Seq)
		}
		for i := range st.Placed {
			restamp("placement", &st.Placed[i].Time, st.Placed[i].Seq)
		}
		for i := range st.Failed {
			restamp("failed apply", &st.Failed[i].Time, st.Failed[i].Seq)
		}
		if p := st.Paused; p != nil {
			restamp("pause", &p.Time, p.Seq)
		}
		if r := st.Retire; r != nil {
			restamp("retire", &r.Time, r.Seq)
			if r.Retired {
				restamp("retired", &r.RetiredTime, r.RetiredSeq)
			}
		}
		if a := st.Agent; a != nil {
			restamp("agent", &a.Time, a.Seq)
		}
		if p := st.Provisioner; p != nil {
			restamp("provisioner", &p.Time, p.Seq)
		}
		if a := st.Ack; a != nil {
			restamp("ack", &a.Time, a.Seq)
		}
		for _, c := range st.Crashes {
			for i, at := range c.Times {
				restamp("crash", &c.Times[i], seqAt[at.UnixNano()])
			}
		}
		got, _ := json.Marshal(st)
		want, ok := live[seq][node]
		if !ok {
			want, _ = json.Marshal(reconcile.NewState(node))
		}
		if string(got) != string(want) {
			t.Fatalf("%s %s as of #%d:\n got %s\nwant %s", how, node, seq, got, want)
		}
	}
	for seq := uint64(1); seq <= uint64(len(s.Events)); seq++ {
		for _, node := range nodes {
			a := histories[node].AsOf(audit.SeqBound(seq))
			check("replay", node, seq, a.State)
		}
		if seq%7 != 0 && seq != uint64(len(s.Events)) {
			continue
		}
		node := s.Events[seq-1].Node
		out, errOut, code := m.cli(t, "audit", node, "--as-of", seqArg(seq), "--json")
		if code != 0 {
			t.Fatalf("audit %s --as-of %d: exit %d: %s", node, seq, code, errOut)
		}
		var a audit.AsOf
		if err := json.Unmarshal([]byte(out), &a); err != nil {
			t.Fatalf("as-of %d: %v\n%s", seq, err, out)
		}
		if a.Seq != seq || a.Note != "" {
			t.Fatalf("as-of %d: folded through #%d, note %q", seq, a.Seq, a.Note)
		}
		check("cli", node, seq, a.State)
	}
	// A sequence that is another node's event is said to fall between.
	other := s.Events[len(s.Events)-1]
	for _, node := range nodes {
		if node == other.Node {
			continue
		}
		out, _, code := m.cli(t, "audit", node, "--as-of", seqArg(other.Seq))
		if code != 0 || !strings.Contains(out, "is not an event of "+node) {
			t.Errorf("as-of another node's event: exit %d\n%s", code, out)
		}
		break
	}
}

// TestAuditIncident1 is DESIGN.md §2 incident 1 over a real stream: the
// timeline shows the refusal, the want that declared the file, the settle
// and the knock, and --why on the knock names those events.
func TestAuditIncident1(t *testing.T) {
	t.Parallel()
	s := reconciletest.New(time.Date(2026, 11, 3, 20, 50, 0, 0, time.UTC), time.Second)
	prov := events.WantModule{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true}
	mbg := events.WantModule{Name: "mesh-build-go", Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: "/run/mesh-build-go/broker.creds", Mode: "0600"}}}
	s.Append("shanks", &events.Want{Modules: []events.WantModule{prov}}) // another node in between
	s.Append("ace", &events.Want{Modules: []events.WantModule{prov}})    // 3, plan 4
	s.Append("ace", &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: 4})
	s.Append("ace", &events.Refusal{Module: "mesh-build-go", Path: "/run/mesh-build-go/broker.creds", Reason: events.ReasonUndeclared, Plan: 4, Writer: "prov"}) // 6
	s.Append("ace", &events.Want{Modules: []events.WantModule{prov, mbg}})                                                                                       // 7, plan 8
	s.Append("ace", &events.Settle{Module: "mesh-build-go", Op: events.OpApply, Plan: 8})                                                                        // 9, knock 10
	s.Append("ace", &events.Filled{Module: "mesh-build-go", Path: "/run/mesh-build-go/broker.creds", Plan: 8, Digest: "hmac-0"})
	if k := s.Events[9]; k.Kind != events.KindKnock {
		t.Fatalf("event 10 is %s, want the knock", k.Kind)
	}
	m := startMesh(t)
	m.publish(t, s)

	out, errOut, code := m.cli(t, "audit", "ace")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 9 {
		t.Fatalf("%d lines, want ace's 9 events:\n%s", len(lines), out)
	}
	for i, want := range []string{"want", "plan", "settle", "refusal /run/mesh-build-go/broker.creds undeclared, plan #4",
		"want    2 modules, 1 file; +mesh-build-go g:1", "plan", "settle  plan #8 settled: mesh-build-go applied",
		"knock   ←#9 declared: /run/mesh-build-go/broker.creds", "filled"} {
		if !strings.Contains(lines[i], want) || len([]rune(lines[i])) > 100 {
			t.Errorf("line %d = %q, want it to contain %q", i+1, lines[i], want)
		}
	}
	if strings.Contains(out, "shanks") {
		t.Error("another node's event in the timeline")
	}

	out, errOut, code = m.cli(t, "audit", "ace", "--why", "10")
	if code != 0 {
		t.Fatalf("why: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"cause     #9 settle", "refused   #6 refusal", "declared  #7 want", "accepted  #8 plan",
		"due       settled plan #8 is newer than plan #4", "replay    folding #9 again makes this knock"} {
		if !strings.Contains(out, want) {
			t.Errorf("--why 10 lacks %q:\n%s", want, out)
		}
	}
	out, _, code = m.cli(t, "audit", "ace", "--why", "10", "--json")
	var w audit.Why
	if code != 0 || json.Unmarshal([]byte(out), &w) != nil || len(w.Owed) != 1 || w.Owed[0].Refusal.Seq != 6 || w.Owed[0].Want.Seq != 7 || w.Cause.Seq != 9 {
		t.Errorf("--why --json: exit %d\n%s", code, out)
	}

	// --json timeline: one JSON document, the entries as an array
	// (issue 25).
	out, _, code = m.cli(t, "audit", "ace", "--json", "--since", "6", "--until", "10")
	if code != 0 {
		t.Fatal(out)
	}
	var kinds []string
	var doc []map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not one JSON document: %v\n%s", err, out)
	}
	for _, raw := range doc {
		kinds = append(kinds, raw["kind"].(string))
	}
	if got := strings.Join(kinds, " "); got != "refusal want plan settle knock" {
		t.Errorf("json kinds %q", got)
	}

	// A time between two events: the read stops at the bound, and the
	// note names the last event at or before it, not "ace's last event".
	// Stream times are the publish times: take the midpoint of #7's and
	// #8's.
	out, _, _ = m.cli(t, "audit", "ace", "--json", "--since", "7", "--until", "8")
	var e78 []struct{ Time time.Time }
	if json.Unmarshal([]byte(out), &e78) != nil || len(e78) != 2 || !e78[1].Time.After(e78[0].Time.Add(100*time.Nanosecond)) {
		t.Fatalf("#7 and #8 as JSON: %s", out)
	}
	e7, e8 := e78[0], e78[1]
	mid := e7.Time.Add(e8.Time.Sub(e7.Time) / 2).UTC().Format(time.RFC3339Nano)
	out, errOut, code = m.cli(t, "audit", "ace", "--as-of", mid)
	if code != 0 || !strings.Contains(out, "the last event of ace at or before it is #") || strings.Contains(out, "last event #") {
		t.Errorf("--as-of between events: exit %d %s\n%s", code, errOut, out)
	}

	// A bound before ace's first event (#3): ace is known, it only had no
	// event yet; not "no events" as for a mistyped name (a fresh user's
	// finding L1).
	for bound, shown := range map[string]string{"2": "#2", "2020-01-01T00:00:00Z": "2020-01-01T00:00:00Z"} {
		out, errOut, code = m.cli(t, "audit", "ace", "--as-of", bound)
		if code != 0 || !strings.Contains(out, "ace as of "+shown+": no event folded") ||
			!strings.Contains(out, "ace has no event at or before it; its first event is #3 want") {
			t.Errorf("--as-of %s, before ace's first event: exit %d %s\n%s", bound, code, errOut, out)
		}
		out, errOut, code = m.cli(t, "audit", "ace", "--until", bound)
		if code != 0 || !strings.Contains(out, "its first event is #3 want") || !strings.Contains(out, "no event of ace in that range") {
			t.Errorf("--until %s, before ace's first event: exit %d %s\n%s", bound, code, errOut, out)
		}
	}
	if _, errOut, code := m.cli(t, "audit", "zed", "--as-of", "2"); code != exitUsage || !strings.Contains(errOut, `node "zed" has no events`) {
		t.Errorf("unknown node --as-of: exit %d %q", code, errOut)
	}

	// Errors: unknown node, a sequence not the node's, bad flags.
	if _, errOut, code := m.cli(t, "audit", "zed"); code != exitUsage || !strings.Contains(errOut, `node "zed" has no events`) {
		t.Errorf("unknown node: exit %d %q", code, errOut)
	}
	if _, errOut, code := m.cli(t, "audit", "ace", "--why", "2"); code != exitUsage || !strings.Contains(errOut, "not an event of the node") {
		t.Errorf("why of shanks's event: exit %d %q", code, errOut)
	}
	if _, _, code := m.cli(t, "audit", "ace", "--as-of", "soon"); code != exitUsage {
		t.Errorf("bad bound: exit %d", code)
	}
	if _, _, code := m.cli(t, "audit", "ace", "--as-of", "3", "--why", "4"); code != exitUsage {
		t.Errorf("two modes: exit %d", code)
	}
}

// reader is the read side over m's stream, as the CLI's read verbs make it.
func (m *mesh) reader(t testing.TB) *query.Reader {
	t.Helper()
	r, err := query.New(m.nc, query.Config{Stream: m.cfg})
	if err != nil {
		t.Fatal(err)
	}
	return r
}
