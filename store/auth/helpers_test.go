package auth_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
	"github.com/meshfold/meshfold/store/embedded"
)

func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// secured is an embedded server in operator mode trusting an auth
// directory with nodes ace and shanks (and extra's).
type secured struct {
	dir *auth.Dir
	srv *embedded.Server
}

func startSecured(t testing.TB, extra ...string) *secured {
	t.Helper()
	d, err := auth.Init(t.TempDir(), auth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range append([]string{"ace", "shanks"}, extra...) {
		if _, err := d.AddNode(n); err != nil {
			t.Fatal(err)
		}
	}
	sa, err := d.ServerAuth()
	if err != nil {
		t.Fatal(err)
	}
	e, err := embedded.Start(embedded.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:-1", Auth: sa})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	return &secured{dir: d, srv: e}
}

// connect connects as user over TCP, with the options store.Connect uses
// for its creds file (the user's own inbox prefix included) and extra
// after them. It does not reconnect.
func (s *secured) connect(user string, extra ...nats.Option) (*nats.Conn, error) {
	opts, err := store.ConnectConfig{URLs: []string{s.srv.ClientURL()}, Creds: s.dir.CredsPath(user), Name: user,
		Logger: slog.New(slog.DiscardHandler)}.Options()
	if err != nil {
		return nil, err
	}
	return nats.Connect("", append(append(opts, nats.NoReconnect()), extra...)...)
}

// mustConnect is connect that fails the test, closed by t.Cleanup.
func (s *secured) mustConnect(t testing.TB, user string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := s.connect(user)
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// isAuthError reports whether err is the server refusing a connection's
// credentials.
func isAuthError(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAuthExpired)
}

// readyTimeout bounds a test server's start.
const readyTimeout = 10 * time.Second
