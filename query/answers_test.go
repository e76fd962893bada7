package query_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// StreamAnswers is nil while the stream has a leader, and says the stream
// does not answer (ErrStreamSilent) once two of its three servers were
// killed -9: the cluster lost its quorum, and the console's fleet page
// says so.
func TestStreamAnswersSaysAQuorumLoss(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills servers: not in -short")
	}
	pc := storetest.StartProcCluster(t, 3)
	_, js := pc.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	leader := pc.AwaitLeader(t, ctx, js, cfg.Name, 30*time.Second)
	nc, _ := pc.ConnectVia(t, leader)
	r, err := query.New(nc, query.Config{Stream: cfg})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.StreamAnswers(ctx); err != nil {
		t.Fatalf("StreamAnswers with a leader: %v", err)
	}
	pc.Kill((leader + 1) % pc.N())
	pc.Kill((leader + 2) % pc.N())
	err = waitfor.Value(t, time.Minute, "StreamAnswers to say the stream does not answer", func() (error, bool) {
		err := r.StreamAnswers(ctx)
		return err, err != nil
	})
	if !errors.Is(err, query.ErrStreamSilent) {
		t.Errorf("StreamAnswers after a quorum loss: %v, want one matching query.ErrStreamSilent", err)
	}
	t.Logf("after the quorum loss: %v", err)
}
