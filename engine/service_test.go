package engine_test

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
	"github.com/meshfold/meshfold/store/storetest"
)

// fakeLookup serves ace's state from a history built with the fold.
func fakeLookup(t *testing.T) (func(string) (*reconcile.State, bool), *reconcile.State) {
	s := reconciletest.New(t0, time.Second)
	s.Append("ace", &events.Want{Modules: []events.WantModule{
		{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true},
		{Name: "nats", Build: "n:2", RunsAs: "nats", RequiresApproval: true, Files: []events.File{{Path: "/etc/nats/creds", Mode: "0600"}}},
	}})
	s.Append("ace", &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: 2})
	s.Append("ace", &events.Have{Modules: []events.HaveModule{{Name: "provisioner", Build: "p:1", State: events.Running, Account: "prov"}}})
	var mu sync.Mutex
	st := s.State("ace")
	return func(node string) (*reconcile.State, bool) {
		mu.Lock()
		defer mu.Unlock()
		if node != "ace" {
			return nil, false
		}
		return st.Clone(), true
	}, st
}

func TestStateService(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, nc, _ := storetest.Start(t)
	lookup, st := fakeLookup(t)
	svc, err := engine.AddStateService(nc, lookup, engine.StateServiceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })

	v, c, err := query.RequestState(ctx, nc, "", "ace", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := st.View()
	got, _ := json.Marshal(v)
	exp, _ := json.Marshal(want)
	if string(got) != string(exp) {
		t.Errorf("state:\n got %s\nwant %s", got, exp)
	}
	if v.Held != 1 || v.Holds[0].Module != "nats" || v.Holds[0].Pending != "n:2" || v.ProvisionerAccount != "prov" {
		t.Errorf("view = %+v", v)
	}
	if c.Node != "ace" || len(c.Modules) != 2 || !c.Modules[1].Held || c.ProvisionerAccount != "prov" || c.RunningAccount != "prov" {
		t.Errorf("composition = %+v", c)
	}

	// The whole state, for dry runs: the snapshot form, equal to the
	// reconciler's.
	full, err := query.RequestFold(ctx, nc, "", "ace", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got, exp := mustMarshal(t, full), mustMarshal(t, st); got != exp {
		t.Errorf("fold:\n got %s\nwant %s", got, exp)
	}
	if _, err := query.RequestFold(ctx, nc, "", "zed", 5*time.Second); !errors.Is(err, query.ErrUnknownNode) {
		t.Errorf("fold of an unknown node: err = %v, want ErrUnknownNode", err)
	}

	// Unknown node: a clear 404, not an empty success.
	if _, _, err := query.RequestState(ctx, nc, "", "zed", 5*time.Second); !errors.Is(err, query.ErrUnknownNode) {
		t.Errorf("unknown node: err = %v, want ErrUnknownNode", err)
	}
	msg, err := nc.Request(events.StateSubject("mesh", "state", "zed"), nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "404" {
		t.Errorf("unknown node: code %q, want 404", code)
	}
	// A bad node name: 400.
	msg, err = nc.Request("$MESHFOLD.mesh.composition.BAD!", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "400" {
		t.Errorf("bad name: code %q, want 400", code)
	}
	// Another prefix has no service: no reconciler.
	if _, _, err := query.RequestState(ctx, nc, "other", "ace", 5*time.Second); !errors.Is(err, query.ErrNoReconciler) {
		t.Errorf("other prefix: err = %v, want ErrNoReconciler", err)
	}

	// Discovery, as `nats micro ls` and `nats micro info meshfold` do it.
	msg, err = nc.Request("$SRV.PING", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var ping micro.Ping
	if err := json.Unmarshal(msg.Data, &ping); err != nil || ping.Name != events.StateServiceName {
		t.Errorf("ping: %s (%v)", msg.Data, err)
	}
	msg, err = nc.Request("$SRV.INFO.meshfold", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		t.Fatal(err)
	}
	subjects := map[string]string{}
	for _, e := range info.Endpoints {
		subjects[e.Name] = e.Subject
	}
	if subjects["state"] != "$MESHFOLD.mesh.state.*" || subjects["composition"] != "$MESHFOLD.mesh.composition.*" || subjects["fold"] != "$MESHFOLD.mesh.fold.*" {
		t.Errorf("info endpoints = %+v", info.Endpoints)
	}
	stats := svc.Stats()
	if stats.Endpoints[0].NumRequests == 0 {
		t.Errorf("stats: %+v", stats.Endpoints[0])
	}
}

// TestStateServicePartial: with Partial, an instance that does not own
// the node stays silent and the owner answers.
func TestStateServicePartial(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, nc, _ := storetest.Start(t)
	lookup, _ := fakeLookup(t)
	none := func(string) (*reconcile.State, bool) { return nil, false }
	for _, l := range []func(string) (*reconcile.State, bool){none, lookup, none} {
		svc, err := engine.AddStateService(nc, l, engine.StateServiceConfig{Partial: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = svc.Stop() })
	}
	for range 5 {
		if v, _, err := query.RequestState(ctx, nc, "", "ace", 5*time.Second); err != nil || v.Node != "ace" {
			t.Fatalf("owned node: %+v, %v", v, err)
		}
	}
	if _, _, err := query.RequestState(ctx, nc, "", "zed", 200*time.Millisecond); !errors.Is(err, query.ErrNoReconciler) {
		t.Errorf("node nobody owns: err = %v, want ErrNoReconciler (then the snapshot)", err)
	}
}

func mustMarshal(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
