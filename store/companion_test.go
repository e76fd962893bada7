package store_test

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A companion connects where its first connection does, under its own
// name (the server lists both), and its lines name it: a lost server
// logs the first connection's disconnect as before and the companion's
// with conn=<its name>. A closed connection has none.
func TestCompanion(t *testing.T) {
	t.Parallel()
	srv, _, _ := storetest.Start(t)
	h := recordHandler{msg: "nats disconnected", c: make(chan slog.Record, 16)}
	nc, err := store.Connect(store.ConnectConfig{URLs: []string{srv.ClientURL()}, Name: "t", Logger: slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := store.Companion(nc, "t writes")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.ConnectedUrl() != nc.ConnectedUrl() {
		t.Errorf("companion connected to %s, its first connection to %s", c.ConnectedUrl(), nc.ConnectedUrl())
	}
	z, err := srv.NATS().Connz(&server.ConnzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]int{}
	for _, ci := range z.Conns {
		names[ci.Name]++
	}
	if names["t"] != 1 || names["t writes"] != 1 {
		t.Errorf("the server lists the connections %v, want t and t writes once each", names)
	}

	srv.Shutdown()
	conns := map[string]bool{}
	deadline := time.After(30 * time.Second)
	for len(conns) < 2 {
		select {
		case r := <-h.c:
			conn := "(none)"
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "conn" {
					conn = a.Value.String()
				}
				return true
			})
			conns[conn] = true
		case <-deadline:
			t.Fatalf("disconnects logged naming %v, want (none) and t writes", conns)
		}
	}
	if !conns["(none)"] || !conns["t writes"] {
		t.Errorf("disconnects logged naming %v, want the first without conn and the companion as t writes", conns)
	}

	nc.Close()
	if _, err := store.Companion(nc, "late"); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Errorf("a companion of a closed connection: %v, want nats.ErrConnectionClosed", err)
	}
}

// Snapshots.PublishOn sends the puts of PutNodesAt and PutCheckpointAt
// through the context given, and nothing of them through the one the
// bucket was opened with.
func TestSnapshotsPublishOn(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	e, nc, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	wc, err := e.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer wc.Close()
	wjs, err := jetstream.New(wc)
	if err != nil {
		t.Fatal(err)
	}
	snaps.PublishOn(wjs)
	reads, writes := nc.Stats().OutMsgs, wc.Stats().OutMsgs
	revs := map[string]uint64{"ace": 0, "bob": 0}
	if err := snaps.PutNodesAt(ctx, 3, map[string][]byte{"ace": []byte("a"), "bob": []byte("b")}, revs); err != nil {
		t.Fatal(err)
	}
	if _, err := snaps.PutCheckpointAt(ctx, 3, 7, 0); err != nil {
		t.Fatal(err)
	}
	if n := wc.Stats().OutMsgs - writes; n != 3 {
		t.Errorf("%d messages sent on the writes' connection, want 3 (two states, a checkpoint)", n)
	}
	if n := nc.Stats().OutMsgs - reads; n != 0 {
		t.Errorf("%d messages sent on the bucket's own connection, want none", n)
	}
	if st, rev, err := snaps.NodeAt(ctx, 3, "ace"); err != nil || string(st) != "a" || rev != revs["ace"] {
		t.Errorf("ace's state read back: %q at %d (%v), want a at %d", st, rev, err, revs["ace"])
	}
}
