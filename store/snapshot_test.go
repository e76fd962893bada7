package store_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

func TestSnapshots(t *testing.T) {
	ctx := testCtx(t)
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if snaps.Bucket() != "MESH_SNAPSHOTS" {
		t.Errorf("bucket = %q", snaps.Bucket())
	}
	// Opening again is fine.
	if _, err := store.OpenSnapshots(ctx, js, cfg); err != nil {
		t.Fatalf("second open: %v", err)
	}
	if _, _, err := snaps.GetNode(ctx, "ace"); !errors.Is(err, store.ErrNoSnapshot) {
		t.Fatalf("GetNode before any put: err = %v, want ErrNoSnapshot", err)
	}

	pAce := events.Partition("ace", cfg.Partitions)
	if err := snaps.PutNode(ctx, pAce, "ace", []byte(`{"seq":1}`)); err != nil {
		t.Fatal(err)
	}
	if err := snaps.PutNode(ctx, pAce, "ace", []byte(`{"seq":2}`)); err != nil {
		t.Fatal(err)
	}
	state, rev, err := snaps.GetNode(ctx, "ace")
	if err != nil || string(state) != `{"seq":2}` || rev == 0 {
		t.Fatalf("GetNode = %s, %d, %v", state, rev, err)
	}
	if err := snaps.PutNode(ctx, pAce, "Bad.Name", nil); !errors.Is(err, events.ErrInvalid) {
		t.Errorf("PutNode with a bad name: err = %v", err)
	}

	// Many nodes across partitions, batched per partition.
	all := map[string][]byte{"ace": []byte(`{"seq":2}`)}
	byPart := map[int]map[string][]byte{}
	for i := range 300 {
		node := fmt.Sprintf("n%03d", i)
		p := events.Partition(node, cfg.Partitions)
		if byPart[p] == nil {
			byPart[p] = map[string][]byte{}
		}
		byPart[p][node] = []byte(fmt.Sprintf(`{"node":%q}`, node))
		all[node] = byPart[p][node]
	}
	for p, states := range byPart {
		if err := snaps.PutNodes(ctx, p, states); err != nil {
			t.Fatal(err)
		}
		if err := snaps.PutCheckpoint(ctx, p, uint64(1000+p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := snaps.PutNodes(ctx, 0, map[string][]byte{"ok": nil, "NOT OK": nil}); !errors.Is(err, events.ErrInvalid) {
		t.Errorf("PutNodes with a bad name: err = %v", err)
	}

	// LoadPartition: the checkpoint and exactly that partition's nodes.
	for p := range cfg.Partitions {
		cp, nodes, err := snaps.LoadPartition(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		want := maps.Clone(byPart[p])
		if want == nil {
			want = map[string][]byte{}
		}
		if p == pAce {
			want["ace"] = all["ace"]
		}
		if !maps.EqualFunc(nodes, want, func(a, b []byte) bool { return string(a) == string(b) }) {
			t.Errorf("partition %d: %d nodes, want %d", p, len(nodes), len(want))
		}
		wantCP := uint64(0)
		if byPart[p] != nil {
			wantCP = uint64(1000 + p)
		}
		if cp != wantCP {
			t.Errorf("partition %d checkpoint = %d, want %d", p, cp, wantCP)
		}
	}

	// LoadAll and ListNodes see every node once.
	got := map[string][]byte{}
	if err := snaps.LoadAll(ctx, func(node string, state []byte) error {
		if _, dup := got[node]; dup {
			t.Errorf("LoadAll gave %s twice", node)
		}
		got[node] = state
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !maps.EqualFunc(got, all, func(a, b []byte) bool { return string(a) == string(b) }) {
		t.Errorf("LoadAll: %d nodes, want %d", len(got), len(all))
	}
	names, err := snaps.ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := slices.Sorted(maps.Keys(all)); !slices.Equal(names, want) {
		t.Errorf("ListNodes = %d names, want %d", len(names), len(want))
	}
	stop := errors.New("stop")
	n := 0
	if err := snaps.LoadAll(ctx, func(string, []byte) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
		t.Errorf("LoadAll with a failing fn: err %v after %d calls", err, n)
	}
}

func TestSnapshotsEmpty(t *testing.T) {
	ctx := testCtx(t)
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{Name: "OTHER", Prefix: "other"})
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if snaps.Bucket() != "OTHER_SNAPSHOTS" {
		t.Errorf("bucket = %q", snaps.Bucket())
	}
	cp, nodes, err := snaps.LoadPartition(ctx, 3)
	if err != nil || cp != 0 || len(nodes) != 0 {
		t.Errorf("LoadPartition on an empty bucket = %d, %v, %v", cp, nodes, err)
	}
	names, err := snaps.ListNodes(ctx)
	if err != nil || len(names) != 0 {
		t.Errorf("ListNodes on an empty bucket = %v, %v", names, err)
	}
}

// TestFindSnapshotsCreatesNothing: a reader's open of the snapshot bucket
// says there is none, and leaves none; once the bucket exists it opens it.
func TestFindSnapshotsCreatesNothing(t *testing.T) {
	ctx := testCtx(t)
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	if _, err := store.FindSnapshots(ctx, js, cfg); !errors.Is(err, store.ErrNoSnapshots) {
		t.Fatalf("no bucket: err = %v, want ErrNoSnapshots", err)
	}
	if _, err := js.KeyValue(ctx, cfg.Name+store.SnapshotBucketSuffix); err == nil {
		t.Fatal("FindSnapshots created the bucket")
	}
	if _, err := store.OpenSnapshots(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	snaps, err := store.FindSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatalf("existing bucket: %v", err)
	}
	if snaps.Bucket() != cfg.Name+store.SnapshotBucketSuffix {
		t.Errorf("bucket %q", snaps.Bucket())
	}
}
