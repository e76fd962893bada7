package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
)

// An ask made again while unanswered (FollowRidingOut's consumer
// creation, a bucket's open) whose request the credentials may not
// publish ends at once with the permission error: NATS answers a denied
// request with no reply, and the ask, taking the silence for a leader's
// election, asked again until its bound (30 s here) instead of saying
// the credentials' mistake.
func TestAskDeniedEndsAtOnce(t *testing.T) {
	srv, err := server.NewServer(&server.Options{ServerName: "askdenied", Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		Users: []*server.User{
			{Username: "admin", Password: "pw"},
			{Username: "node", Password: "pw", Permissions: &server.Permissions{Publish: &server.SubjectPermission{
				Allow: []string{"$JS.API.>"},
				Deny:  []string{"$JS.API.CONSUMER.CREATE.MESH.>", "$JS.API.STREAM.INFO.KV_MESH_SECRETS"},
			}}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	connect := func(user string) jetstream.JetStream {
		t.Helper()
		nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, "pw"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := connect("admin")
	_, cfg, err := store.EnsureStream(ctx, admin, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.OpenSecrets(ctx, admin, store.StreamConfig{}, true); err != nil {
		t.Fatal(err)
	}
	js := connect("node")
	// Well under one attempt's most (5 s) and the bound (30 s): the
	// denial is reported as soon as the server says it.
	const within = 4 * time.Second
	for _, tc := range []struct {
		name, subject string
		ask           func(context.Context) error
	}{
		{"FollowRidingOut", "$JS.API.CONSUMER.CREATE.MESH.", func(ctx context.Context) error {
			tail, err := store.FollowRidingOut(ctx, js, store.TailConfig{Stream: cfg.Name, Subjects: cfg.Subjects(), New: true})
			if err == nil {
				tail.Stop()
			}
			return err
		}},
		{"OpenSecrets", "$JS.API.STREAM.INFO.KV_MESH_SECRETS", func(ctx context.Context) error {
			_, err := store.OpenSecrets(ctx, js, store.StreamConfig{}, false)
			return err
		}},
	} {
		actx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		err := tc.ask(actx)
		cancel()
		took := time.Since(start)
		var de *store.DeniedError
		if !errors.Is(err, store.ErrPermissionDenied) || !errors.Is(err, nats.ErrPermissionViolation) || !errors.As(err, &de) || !strings.HasPrefix(de.Subject, tc.subject) {
			t.Errorf("%s denied: %v after %v; want a *DeniedError of %s…", tc.name, err, took, tc.subject)
			continue
		}
		if took > within {
			t.Errorf("%s denied: ended after %v, want within %v", tc.name, took, within)
		}
	}
	// Allowed asks on the same connection still succeed.
	if _, err := store.OpenFillStatus(ctx, js, store.StreamConfig{}, true); err != nil {
		t.Errorf("allowed bucket open: %v", err)
	}
}
