package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// reconcileProc is a `meshfold reconcile` run in process.
type reconcileProc struct {
	cancel context.CancelFunc
	code   chan int
	stderr *storetest.SyncBuffer
}

func startReconcile(t *testing.T, args ...string) *reconcileProc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &reconcileProc{cancel: cancel, code: make(chan int, 1), stderr: &storetest.SyncBuffer{}}
	go func() {
		p.code <- run(ctx, append([]string{"reconcile"}, args...), nil, &storetest.SyncBuffer{}, p.stderr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-p.code:
		case <-time.After(stopLimit):
			t.Errorf("meshfold reconcile did not stop within %s of its cancel; stderr:\n%s", stopLimit, p.stderr.String())
		}
	})
	return p
}

// stopLimit bounds a graceful stop: a group member waits up to 30 s plus
// its lease TTL for its partitions to stop (engine.Group.Run), and a
// loaded machine needs some of that.
const stopLimit = 30*time.Second + engine.DefaultLeaseTTL + 15*time.Second

// stop stops it as SIGTERM would and returns its exit code.
func (p *reconcileProc) stop(t *testing.T) int {
	t.Helper()
	p.cancel()
	select {
	case code := <-p.code:
		p.code <- code
		return code
	case <-time.After(stopLimit):
		t.Fatalf("meshfold reconcile did not stop within %s; stderr:\n%s", stopLimit, p.stderr.String())
		return 0
	}
}

// TestReconcileGroupOnCluster runs two `meshfold reconcile --group`
// instances against a 3-server cluster with --replicas 3: they split the
// 16 partitions (the lease bucket says who holds which), each folds the
// nodes of its half and answers `meshfold state` for them; stopping one
// hands its partitions to the other, which folds their next events.
func TestReconcileGroupOnCluster(t *testing.T) {
	t.Parallel()
	c := storetest.StartCluster(t, 3)
	nc, js := c.Connect(t)
	// The default lease TTL: every handover here is graceful (a joins,
	// a leaves) and waits on no expiry, while a 2 s TTL was shorter than
	// the loaded cluster's stalls (renewals timed out for 3 s), so both
	// instances lost their leases mid-test and a state asked then came
	// from the snapshot.
	common := []string{"--server", c.URLs(), "--replicas", "3", "--group", "g", "--snapshot-interval", "50ms",
		"--signing-key", filepath.Join(t.TempDir(), signingKeyFile)}
	a := startReconcile(t, append(common, "--instance", "a")...)
	var b *reconcileProc
	// What both said, on a failure from the first wait on (a's start
	// timed out twice at load ~35 and said nothing).
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("instance a said:\n%s", a.stderr.String())
			if b != nil {
				t.Logf("instance b said:\n%s", b.stderr.String())
			}
		}
	})
	// b joins once a runs, as a second instance joins a running group; the
	// store's group tests start instances together.
	pollUntil(t, "a to own every partition", func() bool { return strings.Contains(a.stderr.String(), `msg="partitions owned"`) })
	b = startReconcile(t, append(common, "--instance", "b")...)
	ctx := testCtx(t)

	// Each instance logs the partitions it owns whenever they change; the
	// last such line is what it owns now.
	owned := func(p *reconcileProc) int {
		n := -1
		for _, line := range strings.Split(p.stderr.String(), "\n") {
			if strings.Contains(line, `msg="partitions owned"`) {
				if i := strings.Index(line, " count="); i >= 0 {
					fmt.Sscanf(line[i+len(" count="):], "%d", &n)
				}
			}
		}
		return n
	}
	pollUntil(t, "a and b to own 8 partitions each", func() bool { return owned(a) == 8 && owned(b) == 8 })
	stream, cfg, err := store.OpenStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Replicas != 3 {
		t.Fatalf("stream replicas %d", cfg.Replicas)
	}
	pub := store.NewPublisher(js, cfg.Subjects())
	want := func(node, build string) uint64 {
		w := events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "postgres", Build: build}}}, time.Now())
		ack, err := pub.Append(ctx, node, w)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Seq
	}
	planned := func(node string, cause uint64) bool {
		m, err := store.LastMsg(ctx, stream, cfg.Subjects(), node, events.KindPlan)
		if err != nil {
			return false
		}
		p, ok := m.Event.Payload.(*events.Plan)
		return ok && p.Cause == cause
	}
	var low, high string // a node of a's half, one of b's
	for i := 0; low == "" || high == ""; i++ {
		n := fmt.Sprintf("node-%d", i)
		if events.Partition(n, cfg.Partitions) < 8 {
			low = n
		} else {
			high = n
		}
	}
	for _, n := range []string{low, high} {
		seq := want(n, "pg:1")
		pollUntil(t, "the plan of "+n, func() bool { return planned(n, seq) })
	}
	state := func(node string) string {
		var out, errb storetest.SyncBuffer
		code := run(ctx, []string{"state", node, "--json", "--server", c.URLs(), "--timeout", "500ms"}, nil, &out, &errb)
		if code != 0 {
			t.Fatalf("state %s: exit %d: %s", node, code, errb.String())
		}
		var r stateReply
		if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
			t.Fatal(err)
		}
		return string(r.Source)
	}
	for _, n := range []string{low, high} {
		if src := state(n); src != string(query.SourceReconciler) {
			t.Errorf("state of %s from %q, want the live reconciler", n, src)
		}
	}
	// A node no instance has folded an event of is answered "unknown"
	// by the instance whose partition it is, at once: without that
	// answer each ask waited out its timeout, and an apply of 185 new
	// nodes ran out of its own (a fresh user's finding, fresh13 G2).
	for _, half := range []int{0, 8} {
		ghost := ""
		for i := 0; ghost == ""; i++ {
			if n := fmt.Sprintf("ghost-%d", i); events.Partition(n, cfg.Partitions)/8 == half/8 {
				ghost = n
			}
		}
		if _, _, err := query.RequestState(ctx, nc, "", ghost, 20*time.Second); !errors.Is(err, query.ErrUnknownNode) {
			t.Errorf("state of %s, a node of no event, in partition %d: %v; want query.ErrUnknownNode from its owner", ghost, events.Partition(ghost, cfg.Partitions), err)
		}
	}

	// a leaves: b takes its half over and folds its next events.
	if code := a.stop(t); code != 0 {
		t.Fatalf("a exited %d: %s", code, a.stderr.String())
	}
	pollUntil(t, "b to own every partition", func() bool { return owned(b) == 16 })
	seq := want(low, "pg:2")
	pollUntil(t, "b's plan of "+low, func() bool { return planned(low, seq) })
	if src := state(low); src != string(query.SourceReconciler) {
		t.Errorf("state of %s from %q after the handover", low, src)
	}
	if code := b.stop(t); code != 0 {
		t.Fatalf("b exited %d: %s", code, b.stderr.String())
	}
	if !strings.Contains(b.stderr.String(), "leases released") {
		t.Errorf("b's log lacks its release:\n%s", b.stderr.String())
	}
	// Both released their leases: the bucket holds none (polled: a
	// replica may answer a direct get before it applied the deletes).
	pollUntil(t, "no lease left after both stopped gracefully", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		kv, err := js.KeyValue(cctx, store.DefaultStreamName+engine.LeaseBucketSuffix)
		if err != nil {
			return false
		}
		for p := range 16 {
			if _, err := kv.Get(cctx, fmt.Sprintf("lease.%d", p)); err == nil {
				return false
			}
		}
		return true
	})
}

// pollUntil polls cond until it holds, for up to 20 s (internal/waitfor).
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitfor.Until(t, 20*time.Second, what, cond)
}
