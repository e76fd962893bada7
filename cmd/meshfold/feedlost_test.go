package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
	"github.com/meshfold/meshfold/store"
)

// An agent that lives and reads no plan (its plan feed lost: its lease
// says since when) needs an operator in fleet and state; when it reads
// again, it needs nothing. A lease of an older agent (no such field)
// needs nothing either. Before, 272 of 300 agents followed no plan while
// fleet said "nothing 301" (a fresh user's finding M8).
func TestFleetSaysAFeedLost(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	ctx := testCtx(t)
	snaps, err := store.OpenSnapshots(ctx, m.js, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := reconciletest.New(time.Now().Add(-time.Minute), time.Millisecond)
	mod := events.WantModule{Name: "web", Build: "w:1", RunsAs: "web"}
	names := []string{"n001", "n002", "n003"}
	for _, n := range names {
		s.Append(n, &events.Want{Modules: []events.WantModule{mod}})
		s.Append(n, &events.Settle{Module: "web", Op: events.OpApply, Plan: s.State(n).Emitted().Seq})
		s.Append(n, &events.Have{Modules: []events.HaveModule{{Name: "web", Build: "w:1", State: events.Running, Account: "web"}}})
		s.Append(n, &events.Agent{State: events.AgentUp, Claim: "c-" + n})
		data, _ := json.Marshal(s.State(n))
		if err := snaps.PutNode(ctx, events.Partition(n, m.cfg.Partitions), n, data); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := store.OpenNodeLeases(ctx, m.js, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	// n001's agent: this build's lease, its feed lost, then read again.
	lease, err := store.AcquireLease(ctx, kv, "n001", store.NewHolder("node", "n001"), quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	// n002's: an older agent's lease, renewed by hand (no feed_lost).
	old := fmt.Sprintf(`{"role":"node","name":"n002","host":"h","pid":1,"since":%q,"token":"old"}`, time.Now().UTC().Format(time.RFC3339Nano))
	if _, err := kv.Put(ctx, "n002", []byte(old)); err != nil {
		t.Fatal(err)
	}
	// written waits for n001's lease to say lost (or not).
	w, err := kv.Watch(ctx, "n001")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	written := func(lost bool) {
		t.Helper()
		for {
			select {
			case e := <-w.Updates():
				if e == nil || e.Operation() != jetstream.KeyValuePut {
					continue
				}
				var h store.Holder
				if err := json.Unmarshal(e.Value(), &h); err != nil {
					t.Fatal(err)
				}
				if h.FeedLost.IsZero() != lost {
					return
				}
			case <-ctx.Done():
				t.Fatalf("n001's lease never said its feed lost=%v", lost)
			}
		}
	}
	since := time.Now().Add(-90 * time.Second)
	lease.SetFeedLost(since)
	written(true)

	out, errOut, code := m.cli(t, "fleet", "--warnings", "0")
	if code != exitOK {
		t.Fatalf("fleet: %d %s", code, errOut)
	}
	row := func(out, node string) string {
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, node+" ") {
				return l
			}
		}
		return ""
	}
	if r := row(out, "n001"); !strings.Contains(r, "plan feed lost") {
		t.Errorf("fleet's row of n001, whose agent reads no plan: %q, want it to say so:\n%s", r, out)
	}
	if !strings.Contains(out, "1 needs an operator") || !strings.Contains(out, "feed-lost n001 plan feed lost since ") {
		t.Errorf("fleet does not count n001 as needing an operator, or say since when:\n%s", out)
	}
	for _, n := range []string{"n002", "n003"} {
		if r := row(out, n); strings.Contains(r, "feed") {
			t.Errorf("fleet's row of %s (an older agent's lease; none): %q", n, r)
		}
	}
	js, _, code := m.cli(t, "fleet", "--warnings", "0", "-o", "json")
	if code != exitOK || !strings.Contains(js, `"feed_lost":`) || !strings.Contains(js, `"feed-lost"`) {
		t.Errorf("fleet -o json: %d, want n001's feed_lost and need:\n%s", code, js)
	}
	st, errOut, code := m.cli(t, "state", "n001")
	if code != exitOK || !strings.Contains(st, "needs an operator: plan feed lost since "+since.UTC().Truncate(time.Millisecond).Format("2006-01-02T15:04:05")) {
		t.Errorf("state n001: %d %s, want it to say the feed is lost since %s:\n%s", code, errOut, since, st)
	}
	if st, _, _ := m.cli(t, "state", "n002"); strings.Contains(st, "feed") {
		t.Errorf("state n002 (an older agent's lease) speaks of a feed:\n%s", st)
	}

	lease.SetFeedLost(time.Time{})
	written(false)
	out, _, _ = m.cli(t, "fleet", "--warnings", "0")
	if r := row(out, "n001"); strings.Contains(r, "feed") || !strings.Contains(out, "0 need an operator") {
		t.Errorf("fleet after n001's feed reads again: row %q, want nothing needed:\n%s", r, out)
	}
}
