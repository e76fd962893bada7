package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A read of a node's events (store.ReadNode: `meshfold audit`, `rollout
// why`, the tests' reads) made right after the server leading the
// cluster's meta group was killed with SIGKILL ends with the node's
// events once a new meta leader is elected: its consumer's creation, a
// request only the meta leader answers, is asked again. The one request
// sent while there was none was never answered, and the read waited out
// its caller's whole deadline ("read fox: ordered consumer on MESH:
// context deadline exceeded": TestAgentLivenessAcrossALeaseLeaderKill,
// twice under load, when the lease bucket's leader it kills led the meta
// group too).
func TestReadNodeRidesOutAMetaLeaderKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills a server and waits for an election: not in -short")
	}
	pc := storetest.StartProcCluster(t, 3)
	m := pc.MetaLeader()
	if m < 0 {
		t.Fatal("no meta leader")
	}
	// The client's server, o, stays; it leads the stream, so the read's
	// bound (the node's last message) is answered at once, and only the
	// consumer's creation waits for the meta group.
	o := (m + 1) % pc.N()
	urls := strings.Split(pc.URLs(), ",")
	urls[0], urls[o] = urls[o], urls[0]
	nc, err := nats.Connect(strings.Join(urls, ","), nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3, Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	pub := store.NewPublisher(js, cfg.Subjects())
	for _, b := range []string{"a:1", "a:2"} {
		w := events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "app", Build: b}}}, time.Now())
		if _, err := pub.Append(ctx, "ace", w); err != nil {
			t.Fatal(err)
		}
	}
	if err := pc.MoveLeader(ctx, js, cfg.Name, o); err != nil {
		t.Fatal(err)
	}
	if now := pc.MetaLeader(); now != m {
		t.Skipf("the meta leader moved from %s to %s meanwhile", pc.Name(m), pc.Name(now))
	}

	pc.Kill(m)
	killed := time.Now()
	// Longer than an election (4–9 s), shorter than the test's: a read
	// that waits it out fails.
	rctx, rcancel := context.WithTimeout(ctx, 40*time.Second)
	defer rcancel()
	var builds []string
	err = store.ReadNode(rctx, js, cfg.Name, cfg.Subjects(), "ace", 0, 0, func(msg store.Msg) error {
		if w, ok := msg.Event.Payload.(*events.Want); ok {
			builds = append(builds, w.Modules[0].Build)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read of ace %s after %s, the meta leader, was killed: %v", time.Since(killed).Round(time.Millisecond), pc.Name(m), err)
	}
	if strings.Join(builds, " ") != "a:1 a:2" {
		t.Fatalf("read ace's wants %q, want a:1 a:2", builds)
	}
	t.Logf("ace's events read %s after %s, the meta leader, was killed", time.Since(killed).Round(time.Millisecond), pc.Name(m))
}
