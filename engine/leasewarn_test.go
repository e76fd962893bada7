package engine_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
)

// A group member that cannot take the partitions of its share warns, with
// the cause, at most every 10 s: here its user may put its member key but
// is denied every lease key, so each create fails, with the server's
// denial (store.GuardDenied: the server drops a denied request, which
// timed out). It was logged at debug level only: a member holding
// nothing said nothing.
func TestGroupWarnsItCannotTakeItsPartitions(t *testing.T) {
	srv, err := server.NewServer(&server.Options{ServerName: "leasedeny", Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "m", Password: "pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$KV.MESH_LEASES.lease.>"}},
		}}}})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("m", "pw"),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // quiet: the denials are expected
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	logs := newLogRecords()
	g, err := engine.JoinGroup(ctx, js, engine.GroupConfig{Stream: cfg, Name: "test", Instance: "a", TTL: time.Second,
		Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	gctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run(gctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	const warned = "partition leases of this member's share not acquired; retrying"
	// lines returns the records logged with message msg, and the number
	// of failed creates logged at debug level.
	lines := func(msg string) (out []slog.Record, creates int) {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		for _, r := range *logs.recs {
			switch r.Message {
			case msg:
				out = append(out, r)
			case "acquire partition lease":
				creates++
			}
		}
		return out, creates
	}
	waitfor.Until(t, 30*time.Second, "the warning", func() bool { w, _ := lines(warned); return len(w) > 0 })
	w, creates := lines(warned)
	r := w[0]
	if r.Level != slog.LevelWarn {
		t.Errorf("logged at %v, want warn", r.Level)
	}
	attrs := map[string]string{}
	r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
	if attrs["partitions"] != "[0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15]" || !strings.Contains(attrs["err"], "Permissions Violation for Publish to \"$KV.MESH_LEASES.lease.") {
		t.Errorf("warned %v; want every partition and the cause (the denial)", attrs)
	}
	// Rate-limited: the creates go on failing, 16 at a time, a round a
	// few hundred milliseconds; the next warning comes after 10 s.
	waitfor.Until(t, 30*time.Second, "three more rounds of failed creates", func() bool {
		_, n := lines(warned)
		return n >= creates+3*16
	})
	if w, n := lines(warned); len(w) != 1 {
		t.Fatalf("%d warnings over %d failed creates; want one in 10 s", len(w), n)
	}
	if got := g.Owned(); len(got) != 0 {
		t.Fatalf("owns %v with every lease key denied", got)
	}
}
