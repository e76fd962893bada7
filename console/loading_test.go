package console_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/console"
)

// slowFleet is a fake whose Fleet (the snapshots' read) answers once
// release is closed: err, or the fake's fleet.
type slowFleet struct {
	*fake
	release chan struct{}
	err     error
}

func (s *slowFleet) Fleet(ctx context.Context) ([]console.NodeView, error) {
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if s.err != nil {
		return nil, s.err
	}
	return s.fake.Fleet(ctx)
}

// TestFleetPageNotReadIsNoFleet: until the snapshots are read, the fleet
// page says it is loading, and once their read failed, that the fleet
// could not be read and why (logged too), both 503: never "0 nodes ·
// Nothing needs an operator" of a fleet not read (a fresh user's finding
// M7).
func TestFleetPageNotReadIsNoFleet(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"loading", nil, "loading the fleet: its snapshots have not been read yet"},
		{"unread", errors.New("snapshot bucket MESH_SNAPSHOTS: context deadline exceeded"),
			"the fleet could not be read: console: snapshot bucket MESH_SNAPSHOTS: context deadline exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake()
			incident1(f) // ace needs an operator
			sf := &slowFleet{fake: f, release: make(chan struct{}), err: tc.err}
			var logged bytes.Buffer
			c, err := console.New(console.Config{Source: sf, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			srv := httptest.NewServer(c)
			defer srv.Close()
			fx := &fixture{f: f, srv: srv}

			if tc.err != nil {
				close(sf.release)
				select {
				case err := <-done:
					if err == nil || !strings.Contains(err.Error(), tc.err.Error()) {
						t.Fatalf("Run: %v; want the read's error", err)
					}
				case <-time.After(30 * time.Second):
					t.Fatal("Run did not end on the failed read")
				}
				if !strings.Contains(logged.String(), "the fleet could not be read") || !strings.Contains(logged.String(), "context deadline exceeded") {
					t.Errorf("the failed read is not logged with its cause:\n%s", logged.String())
				}
			}
			code, body := fx.get(t, "/")
			if code != 503 || !strings.Contains(body, tc.want) {
				t.Errorf("GET /: %d; want 503 saying %q:\n%s", code, tc.want, body)
			}
			for _, lie := range []string{"Nothing needs an operator", "0 nodes"} {
				if strings.Contains(body, lie) {
					t.Errorf("GET / of a fleet not read says %q:\n%s", lie, body)
				}
			}
			if tc.err != nil {
				return
			}
			close(sf.release)
			fx.waitPage(t, "/", "1 nodes")
			if code, body := fx.get(t, "/"); code != 200 || !strings.Contains(body, `id="need-ace"`) {
				t.Errorf("GET / once loaded: %d; want 200 with ace needing an operator:\n%s", code, body)
			}
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}
}
