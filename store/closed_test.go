package store_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A run that fails while its connection is reconnecting ends with
// ErrConnClosed when the connection closes for good moments later (a
// revoked user's: nats.go gives it up only after its second refused
// reconnect, seconds after the request that failed on the lost
// connection), and with run's own error when the connection comes back.
// Before, WhileConnected returned run's error at once ("watch lease
// bucket: context deadline exceeded" from a revoked reconcile --group).
func TestWhileConnectedWaitsForTheConnectionsFate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		after func(restart func(), nc *nats.Conn)
		want  func(error) bool
	}{
		{"closed for good", func(_ func(), nc *nats.Conn) { nc.Close() }, func(err error) bool { return errors.Is(err, store.ErrConnClosed) }},
		{"reconnected", func(restart func(), _ *nats.Conn) { restart() }, func(err error) bool { return errors.Is(err, errLost) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A reserved port, not the kernel's pick: the restart binds it
			// again, and a port the kernel handed out it may hand to another
			// test's bind or connection while the server is down.
			opts := &server.Options{ServerName: "fate", Host: "127.0.0.1", Port: storetest.FreePort(t), NoLog: true, NoSigs: true}
			srv, err := server.NewServer(opts)
			if err != nil {
				t.Fatal(err)
			}
			srv.Start()
			if !srv.ReadyForConnections(10 * time.Second) {
				t.Fatal("server not ready")
			}
			t.Cleanup(srv.Shutdown)
			nc, err := store.Connect(store.ConnectConfig{URLs: []string{srv.ClientURL()}, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			restart := func() {
				s, err := server.NewServer(opts)
				if err != nil {
					t.Error(err)
					return
				}
				s.Start()
				t.Cleanup(s.Shutdown)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			start := time.Now()
			err = store.WhileConnected(ctx, nc, func(context.Context) error {
				reconnecting := nc.StatusChanged(nats.RECONNECTING)
				defer nc.RemoveStatusListener(reconnecting)
				srv.Shutdown()
				select {
				case <-reconnecting:
				case <-ctx.Done():
					t.Fatal("the connection never reconnected after its server's shutdown")
				}
				// Its fate comes after run has failed.
				time.AfterFunc(100*time.Millisecond, func() { tc.after(restart, nc) })
				return errLost
			})
			if !tc.want(err) {
				t.Fatalf("WhileConnected: %v (after %s)", err, time.Since(start))
			}
			t.Logf("WhileConnected returned %v after %s", err, time.Since(start).Round(time.Millisecond))
		})
	}
}

var errLost = errors.New("request unanswered across the disconnect")
