package console_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshfold/meshfold/console"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/store/storetest"
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
	t.Parallel()
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

// noSnapshotsYet is a fake whose snapshot bucket does not exist (no
// reconciler has checkpointed) until checkpointed is called.
type noSnapshotsYet struct {
	*fake
	mu   sync.Mutex
	none bool
}

func (n *noSnapshotsYet) missing() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.none {
		return fmt.Errorf("bucket MESH_SNAPSHOTS: %w", query.ErrNoSnapshots)
	}
	return nil
}

func (n *noSnapshotsYet) checkpointed() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.none = false
}

func (n *noSnapshotsYet) Fleet(ctx context.Context) ([]console.NodeView, error) {
	if err := n.missing(); err != nil {
		return nil, err
	}
	return n.fake.Fleet(ctx)
}

func (n *noSnapshotsYet) Lag(ctx context.Context) (query.SnapshotLag, error) {
	if err := n.missing(); err != nil {
		return query.SnapshotLag{}, err
	}
	return n.fake.Lag(ctx)
}

// TestFleetPageBeforeTheFirstCheckpoint: a console started before any
// reconciler checkpointed (no snapshot bucket) says the fleet it shows is
// partial, never "Nothing needs an operator" of it, and loads the whole
// fleet once a reconciler has checkpointed: before, a node with no event
// after the console's start (ace, needing an operator) was never shown
// until the console was restarted.
func TestFleetPageBeforeTheFirstCheckpoint(t *testing.T) {
	t.Parallel()
	f := newFake()
	incident1(f) // ace needs an operator
	for len(f.follow) > 0 {
		<-f.follow // stored before the console started: not followed
	}
	src := &noSnapshotsYet{fake: f, none: true}
	logged := &storetest.SyncBuffer{}
	c, err := console.New(console.Config{Source: src, Logger: slog.New(slog.NewTextHandler(logged, nil))})
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
	select {
	case <-c.Loaded():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the console did not load within 30 s")
	}

	code, body := fx.get(t, "/")
	if code != 200 || !strings.Contains(body, "No reconciler has checkpointed this stream yet") {
		t.Errorf("GET / before any checkpoint: %d; want 200 saying no reconciler has checkpointed:\n%s", code, body)
	}
	if strings.Contains(body, "Nothing needs an operator") {
		t.Errorf("GET / before any checkpoint says nothing needs an operator:\n%s", body)
	}
	if !strings.Contains(logged.String(), "no reconciler has checkpointed the stream yet") {
		t.Errorf("the console's log does not say it found no snapshots:\n%s", logged.String())
	}

	src.checkpointed()
	body = fx.waitPage(t, "/", `id="need-ace"`)
	if strings.Contains(body, "No reconciler has checkpointed") {
		t.Errorf("GET / once a reconciler checkpointed still says none has:\n%s", body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Error(err)
	}
}
