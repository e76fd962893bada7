package query_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

var prov = events.WantModule{Name: "provisioner", Build: "p:1", RunsAs: "prov", Provisioner: true}

// setup starts a stream holding ace's want (#1), bob's want (#2) and ace's
// second want (#3), and a reader over it that waits 100 ms for a
// reconciler.
func setup(t *testing.T) (context.Context, *query.Reader) {
	t.Helper()
	_, nc, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	pub := store.NewPublisher(js, cfg.Subjects())
	at := time.Now()
	for _, e := range []struct {
		node string
		mods []events.WantModule
	}{
		{"ace", []events.WantModule{prov}},
		{"bob", []events.WantModule{prov}},
		{"ace", []events.WantModule{prov, {Name: "nats", Build: "n:1", RunsAs: "nats"}}},
	} {
		if _, err := pub.Append(ctx, e.node, events.Stamp(&events.Want{Modules: e.mods}, at)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := query.New(nc, query.Config{Stream: store.StreamConfig{Name: cfg.Name, Prefix: cfg.Prefix}, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, r
}

func TestHistoryPartial(t *testing.T) {
	t.Parallel()
	ctx, r := setup(t)
	h, err := r.History(ctx, "ace", query.Bounds{})
	if err != nil || len(h.Events) != 2 || h.Partial {
		t.Fatalf("whole history: %d events, partial %v, %v", len(h.Events), h.Partial, err)
	}
	b := audit.SeqBound(2)
	h, err = r.History(ctx, "ace", query.Bounds{Until: &b})
	if err != nil || len(h.Events) != 1 || !h.Partial {
		t.Fatalf("history until #2: %d events, partial %v, %v", len(h.Events), h.Partial, err)
	}
	if note := h.AsOf(b).Note; strings.Contains(note, "after ace's last event") || !strings.Contains(note, "the last event of ace at or before it is #1") {
		t.Errorf("as of #2: note %q", note)
	}
	h, err = r.History(ctx, "zed", query.Bounds{})
	if err != nil || len(h.Events) != 0 {
		t.Errorf("a node with no event: %v, %v", h, err)
	}
	if _, err := r.History(ctx, "Bad!", query.Bounds{}); !errors.Is(err, events.ErrInvalid) {
		t.Errorf("bad name: %v", err)
	}
}

// TestStateSources walks the sources from the stream up: folded from the
// stream (no bucket, then no snapshot of the node), the snapshot, then
// the live reconciler.
func TestStateSources(t *testing.T) {
	t.Parallel()
	ctx, r := setup(t)
	st, err := r.State(ctx, "ace")
	if err != nil || st.Source != query.SourceStream || st.View.Seq != 3 || len(st.Composition.Modules) != 2 {
		t.Fatalf("no bucket: %+v, %v", st, err)
	}
	_, err = r.State(ctx, "zed")
	if !errors.Is(err, query.ErrUnknownNode) || !strings.Contains(err.Error(), "no snapshots yet") {
		t.Errorf("unknown, no bucket: %v", err)
	}
	if _, err := r.Fleet(ctx); !errors.Is(err, query.ErrNoSnapshots) {
		t.Errorf("fleet, no bucket: %v", err)
	}
	d, src, err := r.DryRun(ctx, "zed", &events.Want{Modules: []events.WantModule{prov}})
	if err != nil || src != query.SourceNone || d.Seq != 0 || len(d.Modules) != 1 {
		t.Errorf("dry run of an unknown node: %+v %s %v", d, src, err)
	}
}

func TestStateSnapshotAndLive(t *testing.T) {
	t.Parallel()
	_, nc, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub := store.NewPublisher(js, cfg.Subjects())
	if _, err := pub.Append(ctx, "ace", events.Stamp(&events.Want{Modules: []events.WantModule{prov}}, time.Now())); err != nil {
		t.Fatal(err)
	}
	r, err := query.New(nc, query.Config{Stream: cfg, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// A snapshot of a state folded further than the stream holds: what
	// State returns is then the snapshot's.
	h, err := r.History(ctx, "ace", query.Bounds{})
	if err != nil {
		t.Fatal(err)
	}
	snap := h.Fold(len(h.Events))
	snap.Seq = 40
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(snap)
	if err := snaps.PutNode(ctx, events.Partition("ace", cfg.Partitions), "ace", data); err != nil {
		t.Fatal(err)
	}
	if err := snaps.PutNode(ctx, events.Partition("bad", cfg.Partitions), "bad", []byte("{")); err != nil {
		t.Fatal(err)
	}
	st, err := r.State(ctx, "ace")
	if err != nil || st.Source != query.SourceSnapshot || st.View.Seq != 40 {
		t.Fatalf("snapshot: %+v, %v", st, err)
	}
	if _, err := r.State(ctx, "zed"); !errors.Is(err, query.ErrUnknownNode) || !strings.Contains(err.Error(), "no snapshot holds it") {
		t.Errorf("unknown, no snapshot: %v", err)
	}
	nvs, err := r.Fleet(ctx)
	if err != nil || len(nvs) != 2 {
		t.Fatalf("fleet: %+v, %v", nvs, err)
	}
	for _, nv := range nvs {
		switch {
		case nv.Node == "ace" && (nv.Err != nil || nv.View.Seq != 40):
			t.Errorf("fleet row of ace: %+v", nv)
		case nv.Node == "bad" && (nv.Err == nil || nv.Row(time.Now(), time.Minute).Error == ""):
			t.Errorf("fleet row of an undecodable snapshot: %+v", nv)
		}
	}

	live := snap.Clone()
	live.Seq = 50
	svc, err := engine.AddStateService(nc, func(node string) (*reconcile.State, bool) {
		if node != "ace" {
			return nil, false
		}
		return live.Clone(), true
	}, engine.StateServiceConfig{Prefix: cfg.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Stop()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	st, err = r.State(ctx, "ace")
	if err != nil || st.Source != query.SourceReconciler || st.View.Seq != 50 {
		t.Fatalf("live: %+v, %v", st, err)
	}
	if _, err := r.State(ctx, "zed"); !errors.Is(err, query.ErrUnknownNode) || !strings.Contains(err.Error(), "the reconciler has folded no event of it, and the stream holds none") {
		t.Errorf("unknown to the reconciler: %v", err)
	}
	d, src, err := r.DryRun(ctx, "ace", &events.Want{Modules: []events.WantModule{prov}})
	if err != nil || src != query.SourceReconciler || d.Seq != 50 {
		t.Errorf("dry run: %+v %s %v", d, src, err)
	}
	if _, src, err := r.DryRun(ctx, "zed", &events.Want{}); err != nil || src != query.SourceNone {
		t.Errorf("dry run of a node unknown to the reconciler: %s %v", src, err)
	}
}

// TestStateNewerSnapshotFromStream: a snapshot a newer build wrote
// (reconcile.ErrSnapshotNewer) is not shown as an error: the node's state
// is folded from the stream and says so, as a reconciler of this build
// refolds it (docs/operations.md, "Upgrading").
func TestStateNewerSnapshotFromStream(t *testing.T) {
	t.Parallel()
	_, nc, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub := store.NewPublisher(js, cfg.Subjects())
	ack, err := pub.Append(ctx, "ace", events.Stamp(&events.Want{Modules: []events.WantModule{prov}}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	newer := fmt.Sprintf(`{"format":%d,"node":"ace","seq":99,"shape":"unknown"}`, reconcile.SnapshotFormat+1)
	if err := snaps.PutNode(ctx, events.Partition("ace", cfg.Partitions), "ace", []byte(newer)); err != nil {
		t.Fatal(err)
	}
	r, err := query.New(nc, query.Config{Stream: cfg, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	st, err := r.State(ctx, "ace")
	if err != nil || st.Source != query.SourceStream || st.View.Seq != ack.Seq {
		t.Fatalf("state over a newer snapshot: %+v, %v; want folded from the stream to #%d", st, err, ack.Seq)
	}
}

// TestStateUnfoldedNotUnknown: a node whose events the stream holds but
// the reconciler has not folded (it is behind, or its partition cannot
// store its snapshot: a full data directory, the fresh user's V7) is
// shown folded from the stream and said to be unfolded, never "unknown";
// a node of no event at all stays unknown.
func TestStateUnfoldedNotUnknown(t *testing.T) {
	t.Parallel()
	_, nc, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub := store.NewPublisher(js, cfg.Subjects())
	for _, node := range []string{"ace", "bob"} {
		if _, err := pub.Append(ctx, node, events.Stamp(&events.Want{Modules: []events.WantModule{prov}}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	r, err := query.New(nc, query.Config{Stream: cfg, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	h, err := r.History(ctx, "ace", query.Bounds{})
	if err != nil {
		t.Fatal(err)
	}
	ace := h.Fold(len(h.Events))
	// The live reconciler has folded ace only: bob's partition is behind.
	svc, err := engine.AddStateService(nc, func(node string) (*reconcile.State, bool) {
		if node != "ace" {
			return nil, false
		}
		return ace.Clone(), true
	}, engine.StateServiceConfig{Prefix: cfg.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Stop()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	st, err := r.State(ctx, "bob")
	if err != nil {
		t.Fatalf("state of bob, in the stream but not folded: %v", err)
	}
	if st.Source != query.SourceUnfolded || st.View.Seq != 2 || !strings.Contains(st.Source.Text(), "has not folded") {
		t.Errorf("state of bob: source %q (%s), seq %d; want %q at seq 2", st.Source, st.Source.Text(), st.View.Seq, query.SourceUnfolded)
	}
	if _, src, err := r.Fold(ctx, "bob"); err != nil || src != query.SourceUnfolded {
		t.Errorf("fold of bob: %s, %v", src, err)
	}
	if _, err := r.State(ctx, "zed"); !errors.Is(err, query.ErrUnknownNode) || !strings.Contains(err.Error(), "the stream holds none") {
		t.Errorf("a node of no event: %v", err)
	}
}
