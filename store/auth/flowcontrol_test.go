package auth_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
)

// flowBytes is more than a push consumer with flow control delivers
// unanswered: nats-server (v2.15, consumer.go) starts such a consumer's
// window at JsFlowControlMaxPending/16 = 2 MiB, asks for a flow-control
// reply once half of it is out, and stops delivering past the window
// until the reply comes. Every bucket below holds about twice that.
const flowBytes = 4 << 20

// flowDeadline bounds each read, a backstop only: a read stalls when the
// server refuses its flow-control reply, and that refusal, a permissions
// violation the server reports to the connection, ends the read at once
// (count). A few MB on loopback take milliseconds, but seconds under
// -race on a loaded 2-core machine, where the 4 s this was failed a read
// that had not stalled. The buckets' entries outlive it (a minute's TTL).
const flowDeadline = 20 * time.Second

// TestReadsPastFlowControl reads every bucket each role watches through
// nats.go's KV watch (an ordered push consumer with flow control), with
// that role's real credentials, past the server's flow-control window:
// the client's flow-control replies publish on $JS.FC.<stream>.>, and a
// role that may not publish there stalls after the first 2 MiB (the
// server drops the reply as a permissions violation). Watched, by role:
// the reconciler the node lease bucket (engine's agent liveness), the
// group lease bucket (engine.Group's watch) and its partitions'
// snapshots (ScanPartition on load); the operator and the console's
// operator-read the whole snapshot bucket (LoadAll: fleet, and
// FleetSummary's fallback). The secrets, fill status and builds buckets'
// readers are permitted by readKV and readBuilds. A node agent follows
// its plans with a pull consumer, without flow control: read past the
// window too, with a node's credentials. (The reconciler's
// replies pass through its response permission; the operators', before
// their $JS.FC grant on the snapshot bucket, stalled at 20 of 40.)
func TestReadsPastFlowControl(t *testing.T) {
	// Sixteen nodes: each lease at most a node user's payload bound
	// (auth.NodeMaxPayload), together past the flow-control window.
	nodes := []string{"ace", "shanks"}
	for i := 3; len(nodes) < 16; i++ {
		nodes = append(nodes, fmt.Sprintf("n%d", i))
	}
	s := startSecured(t, nodes[2:]...)
	// Not testCtx's 30 s for the whole test: its 8 MiB of puts alone
	// took longer under -race at load 55 ("context deadline exceeded"
	// at a put). Each read has its own bound (count); this one only
	// ends a test that hangs.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, rjs := s.mustConnect(t, "reconciler")
	_, cfg, err := store.EnsureStream(ctx, rjs, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	const keys = 40
	val := bytes.Repeat([]byte("x"), flowBytes/keys)
	if _, err := store.OpenSnapshots(ctx, rjs, cfg); err != nil {
		t.Fatal(err)
	}
	snapKV, err := rjs.KeyValue(ctx, cfg.Name+store.SnapshotBucketSuffix)
	if err != nil {
		t.Fatal(err)
	}
	leaseKV, err := rjs.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: cfg.Name + "_LEASES", History: 1,
		TTL: time.Minute, LimitMarkerTTL: time.Minute, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		if _, err := snapKV.Put(ctx, fmt.Sprintf("node.0.n%02d", i), val); err != nil {
			t.Fatal(err)
		}
		if _, err := leaseKV.Put(ctx, fmt.Sprintf("lease.%d", i), val); err != nil {
			t.Fatal(err)
		}
	}

	// count runs read under flowDeadline and fails the test unless it
	// counted want entries (of size bytes each).
	count := func(t *testing.T, user string, want, size int, read func(ctx context.Context, js jetstream.JetStream, n *int) error) {
		t.Helper()
		nc, js := s.mustConnect(t, user)
		rctx, cancel := context.WithTimeout(ctx, flowDeadline)
		defer cancel()
		// The stall's cause: a reply the server refused to this user.
		rctx, refused := context.WithCancelCause(rctx)
		defer refused(nil)
		nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				refused(err)
			}
		})
		start := time.Now()
		n := 0
		err := read(rctx, js, &n)
		took := time.Since(start)
		if cause := context.Cause(rctx); err != nil && cause != nil {
			err = fmt.Errorf("%w (%w)", err, cause)
		}
		if err != nil || n != want {
			t.Fatalf("%s read %d of %d entries in %v: %v", user, n, want, took.Round(time.Millisecond), err)
		}
		t.Logf("%s: %d entries (%d KiB) in %v", user, n, n*size/1024, took.Round(time.Millisecond))
	}
	watchAll := func(bucket string) func(ctx context.Context, js jetstream.JetStream, n *int) error {
		return func(ctx context.Context, js jetstream.JetStream, n *int) error {
			kv, err := js.KeyValue(ctx, bucket)
			if err != nil {
				return err
			}
			w, err := kv.WatchAll(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = w.Stop() }()
			for {
				select {
				case e := <-w.Updates():
					if e == nil {
						return nil // the end of the initial values
					}
					*n++
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
	}
	loadAll := func(ctx context.Context, js jetstream.JetStream, n *int) error {
		snaps, err := store.OpenSnapshots(ctx, js, cfg)
		if err != nil {
			return err
		}
		return snaps.LoadAll(ctx, func(string, []byte) error { *n++; return nil })
	}

	t.Run("reconciler snapshots of a partition", func(t *testing.T) {
		count(t, "reconciler", keys, len(val), func(ctx context.Context, js jetstream.JetStream, n *int) error {
			snaps, err := store.OpenSnapshots(ctx, js, cfg)
			if err != nil {
				return err
			}
			_, _, err = snaps.ScanPartition(ctx, 0, func(string, []byte) error { *n++; return nil })
			return err
		})
	})
	t.Run("reconciler group leases", func(t *testing.T) {
		count(t, "reconciler", keys, len(val), watchAll(cfg.Name+"_LEASES"))
	})
	t.Run("operator snapshots", func(t *testing.T) { count(t, "operator", keys, len(val), loadAll) })
	t.Run("operator-read snapshots", func(t *testing.T) { count(t, "operator-read", keys, len(val), loadAll) })
	t.Run("node its plans", func(t *testing.T) {
		// A node agent follows its plans (store.FollowNode) with a pull
		// consumer, which has no flow control: past the window with
		// its own credentials and no $JS.FC grant (its only one is the
		// builds bucket's, whose chunks a push consumer reads).
		plan := bytes.Repeat([]byte("x"), flowBytes/keys)
		for range keys {
			if _, err := rjs.Publish(ctx, cfg.Subjects().Event("ace", events.KindPlan), plan); err != nil {
				t.Fatal(err)
			}
		}
		count(t, "node-ace", keys, len(plan), func(ctx context.Context, js jetstream.JetStream, n *int) error {
			tail, err := store.Follow(ctx, js, store.TailConfig{Stream: cfg.Name, Subjects: cfg.Subjects(),
				Filter: cfg.Subjects().Stored("ace", events.KindPlan)})
			if err != nil {
				return err
			}
			defer tail.Stop()
			for *n < keys {
				if _, err := tail.Next(ctx); err != nil {
					return err
				}
				*n++
			}
			return nil
		})
	})
	t.Run("reconciler node leases", func(t *testing.T) {
		// Each node puts its own lease only: few keys, large values. The
		// bucket is made first with a TTL past flowDeadline (the
		// product's, store.DefaultNodeLeaseTTL, is 5 s: entries of a
		// slow read expired under it); OpenNodeLeases opens it as it is.
		if _, err := rjs.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: cfg.Name + store.NodeLeaseBucketSuffix,
			History: 1, TTL: time.Minute, Storage: jetstream.FileStorage}); err != nil {
			t.Fatal(err)
		}
		nodeKV, err := store.OpenNodeLeases(ctx, rjs, cfg)
		if err != nil {
			t.Fatal(err)
		}
		big := bytes.Repeat([]byte("x"), flowBytes/len(nodes))
		if len(big) >= auth.NodeMaxPayload-1024 {
			t.Fatalf("a lease of %d bytes is over a node user's payload bound: add nodes", len(big))
		}
		for _, node := range nodes {
			_, js := s.mustConnect(t, "node-"+node)
			kv, err := js.KeyValue(ctx, nodeKV.Bucket())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := kv.Put(ctx, node, big); err != nil {
				t.Fatalf("node-%s putting its lease: %v", node, err)
			}
		}
		count(t, "reconciler", len(nodes), len(big), watchAll(nodeKV.Bucket()))
	})
}

// TestNodeFlowControlGrants: the node role publishes flow-control
// replies on the builds bucket's stream only (readBuilds: the bundles it
// fetches through an object store get, a push consumer), not on the event
// stream, whose plans it follows with a pull consumer ("node its plans"
// above reads past the window without one), nor on any other bucket.
func TestNodeFlowControlGrants(t *testing.T) {
	p, err := auth.Permissions(auth.RoleNode, "ace", auth.Names{})
	if err != nil {
		t.Fatal(err)
	}
	var fc []string
	for _, s := range p.Pub.Allow {
		if strings.HasPrefix(s, "$JS.FC.") {
			fc = append(fc, s)
		}
	}
	if want := "$JS.FC.OBJ_" + store.DefaultStreamName + "_BUILDS.>"; len(fc) != 1 || fc[0] != want {
		t.Fatalf("node's flow-control grants %v; want only %s", fc, want)
	}
}
