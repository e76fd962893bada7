package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// An ask made again while unanswered (FollowRidingOut's consumer
// creation, a bucket's open) whose request the credentials may not
// publish ends at once with the permission error: NATS answers a denied
// request with no reply, and the ask, taking the silence for a leader's
// election, asked again until its bound (30 s here) instead of saying
// the credentials' mistake.
func TestAskDeniedEndsAtOnce(t *testing.T) {
	// Not parallel: it times the denial against 4 s.
	ps := storetest.StartPermServer(t, map[string]storetest.Publish{
		"admin": {},
		"node":  {Allow: []string{"$JS.API.>"}, Deny: []string{"$JS.API.CONSUMER.CREATE.MESH.>", "$JS.API.STREAM.INFO.KV_MESH_SECRETS"}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, admin := ps.Connect(t, "admin")
	_, cfg, err := store.EnsureStream(ctx, admin, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.OpenSecrets(ctx, admin, store.StreamConfig{}, true); err != nil {
		t.Fatal(err)
	}
	_, js := ps.Connect(t, "node")
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
