package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// DropOrdered asks for the consumer's deletion and does not wait for the
// answer: a stopping reader whose JetStream API does not answer (a
// loaded or stalled cluster) returns at once, where the awaited delete
// held it for its 5 s bound (a node agent's SIGTERM took 8.3 s during a
// stall: a fresh user's finding m6). The request still goes out, named
// as the server expects it, and the consumer is gone afterwards.
func TestDropOrderedDoesNotWaitForTheAnswer(t *testing.T) {
	ctx := testCtx(t)
	e, nc, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})

	// An API nobody answers: a subscriber of its prefix that keeps what
	// it is asked.
	other, err := nats.Connect(e.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	asked, err := other.SubscribeSync("STALLED.API.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Flush(); err != nil {
		t.Fatal(err)
	}
	stalled, err := jetstream.NewWithAPIPrefix(nc, "STALLED.API")
	if err != nil {
		t.Fatal(err)
	}

	cons, err := js.OrderedConsumer(ctx, cfg.Name, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	name := cons.CachedInfo().Name
	returned := make(chan struct{})
	go func() {
		store.DropOrdered(stalled, cfg.Name, cons)
		close(returned)
	}()
	// Not a figure: the awaited delete waited out its 5 s bound here; a
	// request written to the connection takes microseconds.
	select {
	case <-returned:
	case <-time.After(2 * time.Second):
		t.Fatal("DropOrdered still waits for an answer of an API that does not answer")
	}
	m, err := asked.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no delete request was sent: %v", err)
	}
	if want := "STALLED.API.CONSUMER.DELETE." + cfg.Name + "." + name; m.Subject != want || m.Reply == "" {
		t.Errorf("request on %q (reply %q), want %q with a reply subject", m.Subject, m.Reply, want)
	}

	// Against the server's own API the consumer goes, well before its
	// inactivity threshold would remove it.
	store.DropOrdered(js, cfg.Name, cons)
	waitfor.Until(t, store.OrderedInactive/3, "consumer "+name+" deleted", func() bool {
		_, err := js.Consumer(ctx, cfg.Name, name)
		return errors.Is(err, jetstream.ErrConsumerNotFound)
	})
}
