package query_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// Every unanswered knock is said, however many: past the first 200 (a
// get each), Unanswered and KnockCheck read every node's newest knock
// and plan in one pass each (a fresh user's finding: `meshfold fleet`
// read at most 200 and dropped the rest silently). A node whose plan
// declares no file is still never flagged, on either path.
func TestUnansweredPastTheGets(t *testing.T) {
	t.Parallel()
	_, nc, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub := store.NewPublisher(js, cfg.Subjects())
	at := time.Now().Add(-time.Minute)
	const n = 260
	nodes := map[string]uint64{}
	for i := range n {
		node := fmt.Sprintf("n%03d", i)
		var files []events.File
		if i%10 != 0 { // every tenth node declares no file
			files = []events.File{{Path: "/etc/app/key", Mode: "0600"}}
		}
		plan := events.Stamp(&events.Plan{Cause: 1, Want: 1, ProvisionerAccount: "prov", Modules: []events.PlanModule{
			{Name: "app", Build: "img:1", RunsAs: "app", Files: files}}}, at)
		pa, err := pub.Append(ctx, node, plan)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pub.Append(ctx, node, events.Stamp(&events.Knock{Cause: pa.Seq, Reasons: []events.KnockReason{events.KnockOperator}, Owed: []events.Owed{}}, at)); err != nil {
			t.Fatal(err)
		}
		nodes[node] = pa.Seq
	}
	want := n - n/10
	r, err := query.New(nc, query.Config{Stream: cfg})
	if err != nil {
		t.Fatal(err)
	}
	// Asked as of past audit.KnockGrace from now, so every knock is
	// unanswered without setting the package's grace, which the
	// package's other parallel tests read.
	now := time.Now().Add(audit.KnockGrace + time.Second)
	un, err := r.Unanswered(ctx, nodes, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(un) != want {
		t.Errorf("Unanswered of %d knocked nodes: %d unanswered, want %d", n, len(un), want)
	}
	for node := range un {
		if node[len(node)-1] == '0' {
			t.Errorf("%s flagged: its plan declares no file", node)
		}
	}
	k, err := r.KnockCheck(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for node, cause := range nodes {
		p, ok, err := k.Check(ctx, node, cause)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			got++
			if p.State != audit.NoProvisioner || p.Since.IsZero() {
				t.Errorf("%s: problem %+v", node, p)
			}
		}
	}
	if got != want {
		t.Errorf("KnockCheck of %d knocked nodes: %d unanswered, want %d", n, got, want)
	}
}
