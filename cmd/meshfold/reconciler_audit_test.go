package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
)

// TestAuditMatchesReconciler drives incidents 1 and 4 through the real
// reconciler loop (engine.Reconciler publishes the plans, knocks and
// journals) and, after every step, checks that the audit's replay of the
// stream as of the reconciler's last folded sequence equals the
// reconciler's live state of that node. The state service, wired to the
// reconciler, answers `meshfold state` with the same view.
func TestAuditMatchesReconciler(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	ctx := testCtx(t)
	r := m.serveReconciler(t)

	// Plans are awaited by message, not by time: an ordered consumer on
	// the plan subjects delivers each plan once it is stored, with its
	// sequence.
	stream, err := m.js.Stream(ctx, m.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := m.js.OrderedConsumer(ctx, m.cfg.Name, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"*." + m.cfg.Prefix + ".*." + string(events.KindPlan)}})
	if err != nil {
		t.Fatal(err)
	}
	plans, err := pc.Messages()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(plans.Stop)
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	at := time.Date(2026, 11, 3, 20, 50, 0, 0, time.UTC)
	send := func(node string, p events.Payload) {
		t.Helper()
		at = at.Add(time.Second)
		if _, err := pub.Append(ctx, node, events.Stamp(p, at)); err != nil {
			t.Fatal(err)
		}
	}
	waitPlan := func(node string) uint64 {
		t.Helper()
		for {
			msg, err := plans.Next(jetstream.NextContext(ctx))
			if err != nil {
				t.Fatalf("waiting for a plan of %s: %v", node, err)
			}
			n, _, err := m.cfg.Subjects().Parse(msg.Subject())
			if err != nil || n != node {
				continue
			}
			meta, err := msg.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			return meta.Sequence.Stream
		}
	}
	compared := 0
	check := func() {
		t.Helper()
		for _, node := range []string{"ace", "novox"} {
			st, ok := r.Node(node)
			if !ok {
				continue
			}
			b := audit.SeqBound(st.Seq)
			h, err := m.reader(t).History(ctx, node, query.Bounds{Until: &b})
			if err != nil {
				t.Fatal(err)
			}
			got, _ := json.Marshal(h.AsOf(b).State)
			want, _ := json.Marshal(st)
			if string(got) != string(want) {
				t.Fatalf("%s as of #%d:\naudit      %s\nreconciler %s", node, st.Seq, got, want)
			}
			compared++
		}
	}

	prov := events.WantModule{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true}
	mbg := events.WantModule{Name: "mesh-build-go", Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: "/run/mesh-build-go/broker.creds", Mode: "0600"}}}
	nats := func(build string) events.WantModule {
		return events.WantModule{Name: "nats", Build: build, RunsAs: "nats", RequiresApproval: true, Files: []events.File{{Path: "/etc/nats/nats.creds", Mode: "0600"}}}
	}
	// Incident 1 on ace.
	send("ace", &events.Want{Modules: []events.WantModule{prov}})
	p1 := waitPlan("ace")
	check()
	send("ace", &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: p1})
	send("ace", &events.Refusal{Module: "mesh-build-go", Path: "/run/mesh-build-go/broker.creds", Reason: events.ReasonUndeclared, Plan: p1, Writer: "prov"})
	check()
	send("ace", &events.Want{Modules: []events.WantModule{prov, mbg}})
	p2 := waitPlan("ace")
	check()
	send("ace", &events.Settle{Module: "mesh-build-go", Op: events.OpApply, Plan: p2})
	check()
	// Incident 4 on novox, interleaved.
	send("novox", &events.Approve{Module: "nats", Build: "n:2.10", By: "alice"})
	send("novox", &events.Want{Modules: []events.WantModule{nats("n:2.10"), prov}})
	p3 := waitPlan("novox")
	check()
	send("ace", &events.Filled{Module: "mesh-build-go", Path: "/run/mesh-build-go/broker.creds", Plan: p2, Digest: "hmac-1"})
	send("novox", &events.Settle{Module: "nats", Op: events.OpApply, Plan: p3})
	send("novox", &events.Have{Modules: []events.HaveModule{{Name: "nats", Build: "n:2.10", State: events.Running, Account: "nats"}, {Name: "provisioner", Build: "p:1", State: events.Running, Account: "prov"}}})
	send("novox", &events.Want{Modules: []events.WantModule{nats("n:2.11"), prov}})
	p4 := waitPlan("novox")
	check()
	send("novox", &events.Settle{Plan: p4, Op: events.OpApply})
	send("novox", &events.Approve{Module: "nats", Build: "n:2.11", By: "alice"})
	p5 := waitPlan("novox")
	send("novox", &events.Settle{Module: "nats", Op: events.OpApply, Plan: p5})
	check()
	if compared < 10 {
		t.Errorf("only %d comparisons", compared)
	}

	// The knock of incident 1, as the reconciler published it, explained.
	knock, err := store.LastMsg(ctx, stream, m.cfg.Subjects(), "ace", events.KindKnock)
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code := m.cli(t, "audit", "ace", "--why", seqArg(knock.Event.Seq))
	if code != 0 || !strings.Contains(out, "replay    folding #") || !strings.Contains(out, "refused   #") || !strings.Contains(out, "declared  #") {
		t.Errorf("why knock: exit %d %s\n%s", code, errOut, out)
	}
	// `meshfold state` through the service wired to the reconciler.
	out, _, code = m.cli(t, "state", "novox", "--json")
	var sr stateReply
	if code != 0 || json.Unmarshal([]byte(out), &sr) != nil || sr.Source != query.SourceReconciler {
		t.Fatalf("state: exit %d\n%s", code, out)
	}
	b := audit.SeqBound(sr.View.Seq)
	h, err := m.reader(t).History(ctx, "novox", query.Bounds{Until: &b})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(sr.View)
	want, _ := json.Marshal(h.AsOf(b).View)
	if string(got) != string(want) {
		t.Errorf("state service view\n%s\naudit as of #%d\n%s", got, sr.View.Seq, want)
	}
}
