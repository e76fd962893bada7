package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// unansweredCreate is a JetStream whose first stream creation is never
// answered: what a three-server cluster does with a creation asked while
// it has no meta leader (it is not answered even once one is elected).
type unansweredCreate struct {
	jetstream.JetStream
	creates int
}

func (u *unansweredCreate) CreateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	u.creates++
	if u.creates == 1 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return u.JetStream.CreateStream(ctx, cfg)
}

// EnsureStream asks again a creation that goes unanswered, within its
// ctx, instead of waiting out the whole ctx on the first ask
// (TestEffectsRideOutTheirServersKill failed so in CI: "create stream
// MESH: context deadline exceeded" after its 2 minutes).
func TestEnsureStreamAsksAgainAnUnansweredCreate(t *testing.T) {
	t.Parallel()
	_, _, js := storetest.Start(t)
	u := &unansweredCreate{JetStream: js}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t0 := time.Now()
	_, cfg, err := store.EnsureStream(ctx, u, store.StreamConfig{})
	if err != nil {
		t.Fatalf("EnsureStream after %s: %v", time.Since(t0).Round(time.Millisecond), err)
	}
	if u.creates != 2 || cfg.Name != "MESH" {
		t.Fatalf("created %s after %d asks; want MESH after 2", cfg.Name, u.creates)
	}
	t.Logf("stream created on the second ask, %s after the first", time.Since(t0).Round(time.Millisecond))
}
