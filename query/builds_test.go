package query_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// BuildUse counts each node's newest want and have naming the build, not
// an older one, nor a node retired since; once the stream has lost its
// oldest events, the snapshot of a node none of whose wants the stream
// holds still counts, and a snapshot older than a want the stream holds
// does not.
func TestBuildUse(t *testing.T) {
	t.Parallel()
	_, nc, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v1, v2 := "sha256:"+strings.Repeat("1", 64), "sha256:"+strings.Repeat("2", 64)
	web := func(b string) *events.Want {
		return events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: b}}}, time.Now())
	}
	pub := store.NewPublisher(js, cfg.Subjects())
	publish := func(node string, p events.Payload) {
		t.Helper()
		if _, err := pub.Append(ctx, node, p); err != nil {
			t.Fatal(err)
		}
	}
	publish("eve", web(v1)) // #1, lost below
	publish("fay", web(v1)) // #2, lost below; fay's newer want is v2
	publish("ace", web(v1))
	publish("bob", web(v1))
	publish("bob", web(v2)) // bob moved off v1
	publish("cat", events.Stamp(&events.Have{Modules: []events.HaveModule{{Name: "web", Build: v1, State: events.Running}}}, time.Now()))
	publish("dan", web(v1))
	publish("dan", events.Stamp(&events.Retire{By: "ops"}, time.Now()))
	publish("fay", web(v2))
	r, err := query.New(nc, query.Config{Stream: cfg, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, wants, runs []string, snapshots bool) {
		t.Helper()
		u, err := r.BuildUse(ctx, v1)
		if err != nil || !slices.Equal(u.Wants, wants) || !slices.Equal(u.Runs, runs) || u.Snapshots != snapshots || len(u.Reverts) != 0 || !u.InUse() {
			t.Fatalf("%s: %+v, %v; want wants %v, runs %v, snapshots %v", what, u, err, wants, runs, snapshots)
		}
	}
	check("whole stream", []string{"ace", "eve"}, []string{"cat"}, false)

	// The reconciler's snapshots of eve and fay, from when both wanted v1.
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i, node := range []string{"eve", "fay"} {
		data, err := reconcile.MarshalState(&reconcile.State{Node: node, Seq: uint64(i + 1), Want: &reconcile.WantRecord{Seq: uint64(i + 1), Modules: []events.WantModule{{Name: "web", Build: v1}}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := snaps.PutNode(ctx, events.Partition(node, cfg.Partitions), node, data); err != nil {
			t.Fatal(err)
		}
	}
	// An age limit takes the two oldest events.
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(3)); err != nil {
		t.Fatal(err)
	}
	check("oldest events gone", []string{"ace", "eve"}, []string{"cat"}, true)

	if u, err := r.BuildUse(ctx, v2); err != nil || !slices.Equal(u.Wants, []string{"bob", "fay"}) || len(u.Runs) != 0 {
		t.Fatalf("v2: %+v, %v", u, err)
	}
	if u, err := r.BuildUse(ctx, "sha256:"+strings.Repeat("3", 64)); err != nil || u.InUse() {
		t.Fatalf("a build nothing names: %+v, %v", u, err)
	}
	if _, err := r.BuildUse(ctx, "img:1"); err == nil {
		t.Fatal("BuildUse of another runtime's build: no error")
	}
}
