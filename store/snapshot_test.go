package store_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

func TestSnapshots(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// TestScanSummaries: each node's summary from the headers only, the
// latest of a key written twice, a node with none returned bare (and a
// summary put over it counts), deleted keys and checkpoints skipped; a
// state put with its summary reads back whole; an empty bucket and a
// done context.
func TestScanSummaries(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	scan := func(ctx context.Context) (map[string]string, []string, error) {
		got := map[string]string{}
		bare, err := snaps.ScanSummaries(ctx, func(node string, sum []byte) error {
			got[node] = string(sum)
			return nil
		})
		return got, bare, err
	}
	if got, bare, err := scan(ctx); err != nil || len(got) != 0 || len(bare) != 0 {
		t.Fatalf("empty bucket: %v %v %v", got, bare, err)
	}
	put := func(node, state, sum string) {
		t.Helper()
		sums := map[string][]byte{}
		if sum != "" {
			sums[node] = []byte(sum)
		}
		if err := snaps.PutSummarizedAt(ctx, events.Partition(node, cfg.Partitions), map[string][]byte{node: []byte(state)}, sums, nil); err != nil {
			t.Fatal(err)
		}
	}
	put("ace", `{"seq":1}`, `{"seq":1,"s":"a\u00e9"}`)
	put("ace", `{"seq":2}`, `{"seq":2}`)
	put("bob", `{"seq":3}`, "")
	put("cat", `{"seq":4}`, "")
	put("cat", `{"seq":5}`, `{"seq":5}`)
	put("dan", `{"seq":6}`, `{"seq":6}`)
	if err := snaps.PutCheckpoint(ctx, 0, 9); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, snaps.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, fmt.Sprintf("node.%d.dan", events.Partition("dan", cfg.Partitions))); err != nil {
		t.Fatal(err)
	}
	got, bare, err := scan(ctx)
	if want := map[string]string{"ace": `{"seq":2}`, "cat": `{"seq":5}`}; err != nil || !maps.Equal(got, want) || !slices.Equal(bare, []string{"bob"}) {
		t.Fatalf("summaries %v bare %v, %v; want %v bare [bob]", got, bare, err, want)
	}
	if state, _, err := snaps.GetNode(ctx, "cat"); err != nil || string(state) != `{"seq":5}` {
		t.Errorf("cat's state: %s, %v", state, err)
	}
	// The scans' consumers are deleted once each scan ends (not
	// awaited, so not at once): none lingers to its inactivity threshold.
	waitfor.Until(t, 10*time.Second, "the scans' consumers deleted", func() bool {
		info, err := js.Stream(ctx, "KV_"+snaps.Bucket())
		return err == nil && info.CachedInfo().State.Consumers == 0
	})
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := scan(done); !errors.Is(err, context.Canceled) {
		t.Errorf("done context: %v", err)
	}
}

// TestNodeAt: a node's state and its key's revision; a deleted key's
// marker revision with no state (what the next conditional put expects);
// nothing for a key never written.
func TestNodeAt(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := events.Partition("ace", cfg.Partitions)
	if state, rev, err := snaps.NodeAt(ctx, p, "ace"); err != nil || state != nil || rev != 0 {
		t.Fatalf("NodeAt before any put = %s, %d, %v", state, rev, err)
	}
	revs := map[string]uint64{}
	if err := snaps.PutNodesAt(ctx, p, map[string][]byte{"ace": []byte(`{"seq":1}`)}, revs); err != nil {
		t.Fatal(err)
	}
	state, rev, err := snaps.NodeAt(ctx, p, "ace")
	if err != nil || string(state) != `{"seq":1}` || rev != revs["ace"] {
		t.Fatalf("NodeAt = %s, %d, %v; want the put's state at revision %d", state, rev, err, revs["ace"])
	}
	kv, err := js.KeyValue(ctx, snaps.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, fmt.Sprintf("node.%d.ace", p)); err != nil {
		t.Fatal(err)
	}
	state, rev, err = snaps.NodeAt(ctx, p, "ace")
	if err != nil || state != nil || rev <= revs["ace"] {
		t.Fatalf("NodeAt after a delete = %s, %d, %v; want no state and the marker's revision", state, rev, err)
	}
	revs["ace"] = rev
	if err := snaps.PutNodesAt(ctx, p, map[string][]byte{"ace": []byte(`{"seq":2}`)}, revs); err != nil {
		t.Fatalf("a put expecting the marker's revision: %v", err)
	}
	if n, err := snaps.Stored(ctx); err != nil || n != 1 {
		t.Fatalf("Stored = %d, %v; want 1 (history 1)", n, err)
	}
}

// TestPutNodesAtNamesItsConflicts: puts whose expected revisions are
// stale fail with a *store.NodeConflictError that matches ErrConflict and
// names every such node, and NodeAtLeader reads the revision that failed
// them; the put that was not stale is stored.
func TestPutNodesAtNamesItsConflicts(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{Partitions: 1})
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	first := map[string]uint64{}
	if err := snaps.PutNodesAt(ctx, 0, map[string][]byte{"ace": []byte(`1`), "bob": []byte(`1`), "cid": []byte(`1`)}, first); err != nil {
		t.Fatal(err)
	}
	// Another writer moves ace and cid on.
	if err := snaps.PutNodesAt(ctx, 0, map[string][]byte{"ace": []byte(`2`), "cid": []byte(`2`)}, maps.Clone(first)); err != nil {
		t.Fatal(err)
	}
	revs := maps.Clone(first)
	err = snaps.PutNodesAt(ctx, 0, map[string][]byte{"ace": []byte(`3`), "bob": []byte(`3`), "cid": []byte(`3`)}, revs)
	var conflict *store.NodeConflictError
	if !errors.As(err, &conflict) || !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale puts: %v, want a NodeConflictError matching ErrConflict", err)
	}
	if !slices.Equal(conflict.Nodes, []string{"ace", "cid"}) {
		t.Errorf("conflicting nodes %q, want ace and cid", conflict.Nodes)
	}
	if revs["bob"] == first["bob"] {
		t.Errorf("bob's put, not stale, was not stored")
	}
	for _, node := range conflict.Nodes {
		state, rev, err := snaps.NodeAtLeader(ctx, 0, node)
		if err != nil || string(state) != "2" || rev == first[node] {
			t.Fatalf("NodeAtLeader(%s) = %s, %d, %v; want the other writer's state and revision", node, state, rev, err)
		}
		revs[node] = rev
	}
	if err := snaps.PutNodesAt(ctx, 0, map[string][]byte{"ace": []byte(`3`), "cid": []byte(`3`)}, revs); err != nil {
		t.Fatalf("puts at the revisions read again: %v", err)
	}
}

// TestPutCheckpointAt: a checkpoint put is conditional on the key's
// revision, which CheckpointRev reads with the sequence; a stale one
// fails with ErrConflict and leaves the key.
func TestPutCheckpointAt(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{Partitions: 1})
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ck, rev, err := snaps.CheckpointRev(ctx, 0); err != nil || ck != 0 || rev != 0 {
		t.Fatalf("CheckpointRev before any put = %d, %d, %v", ck, rev, err)
	}
	rev, err := snaps.PutCheckpointAt(ctx, 0, 7, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ck, got, err := snaps.CheckpointRev(ctx, 0); err != nil || ck != 7 || got != rev {
		t.Fatalf("CheckpointRev = %d, %d, %v; want 7 at %d", ck, got, err, rev)
	}
	if _, err := snaps.PutCheckpointAt(ctx, 0, 3, 0); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a put at a stale revision: %v, want ErrConflict", err)
	}
	if _, err := snaps.PutCheckpointAt(ctx, 0, 9, rev); err != nil {
		t.Fatalf("a put at the revision read: %v", err)
	}
	if ck, err := snaps.Checkpoint(ctx, 0); err != nil || ck != 9 {
		t.Fatalf("Checkpoint = %d, %v; want 9", ck, err)
	}
}
