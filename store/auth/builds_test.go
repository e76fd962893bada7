package auth_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/node/bundle"
	"github.com/meshfold/meshfold/store"
)

// buildsFixture is the operator's connection and the bundle every "fetch
// build" reads, set by setupBuilds (the tests of this package run one at
// a time).
var buildsFixture struct {
	js    jetstream.JetStream
	build string
	n     atomic.Int64
}

// newBundle returns distinct bundle bytes and their build.
func newBundle() (string, []byte) {
	data := []byte(fmt.Sprintf("bundle %d", buildsFixture.n.Add(1)))
	return bundle.BuildOf(data), data
}

// setupBuilds pushes, as the operator, the bundle "fetch build" reads
// (creating the bucket): 4 MiB of random bytes.
func setupBuilds(t *testing.T, s *secured) {
	t.Helper()
	_, js := s.mustConnect(t, "operator")
	// Large enough to take many chunks (128 KiB each) with flow control,
	// as a real bundle does.
	data := make([]byte, 4<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	build := bundle.BuildOf(data)
	if _, _, err := bundle.NewStore(js, "").Push(testCtx(t), build, "matrix", bytes.NewReader(data)); err != nil {
		t.Fatalf("operator pushing a bundle: %v", err)
	}
	buildsFixture.js, buildsFixture.build = js, build
}

// builds adds the actions on the builds bucket.
func builds(acts map[string]action, cfg store.StreamConfig) {
	acts["push build"] = func(ctx context.Context, c *cell) error {
		build, data := newBundle()
		_, _, err := bundle.NewStore(c.js, cfg.Name).Push(ctx, build, "matrix", bytes.NewReader(data))
		return err
	}
	acts["list builds"] = func(ctx context.Context, c *cell) error {
		l, err := bundle.NewStore(c.js, cfg.Name).List(ctx)
		if err == nil && len(l) == 0 {
			err = fmt.Errorf("listed no bundle")
		}
		return err
	}
	acts["stat build"] = func(ctx context.Context, c *cell) error {
		_, err := bundle.NewStore(c.js, cfg.Name).Stat(ctx, buildsFixture.build)
		return err
	}
	acts["fetch build"] = func(ctx context.Context, c *cell) error {
		r, _, err := bundle.NewStore(c.js, cfg.Name).Open(ctx, buildsFixture.build)
		if err != nil {
			return err
		}
		defer r.Close()
		_, err = io.Copy(io.Discard, r)
		return err
	}
	acts["remove build"] = func(ctx context.Context, c *cell) error {
		build, data := newBundle()
		if _, _, err := bundle.NewStore(buildsFixture.js, cfg.Name).Push(ctx, build, "matrix", bytes.NewReader(data)); err != nil {
			return fmt.Errorf("the operator pushing the bundle to remove: %w", err)
		}
		return bundle.NewStore(c.js, cfg.Name).Remove(ctx, build)
	}
}

func TestBuildsBucketSuffix(t *testing.T) {
	if got := bundle.BucketName(store.DefaultStreamName); got != store.DefaultStreamName+"_BUILDS" {
		t.Fatalf("bundle.BucketName = %s; the policy is written for %s_BUILDS", got, store.DefaultStreamName)
	}
}
