package engine

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestALostAnswerLeavesThePendingPublishes publishes, through the
// JetStream context Serve makes, to a subject whose one responder never
// answers, as a stream leader killed while the client stays connected
// to another server: the publish's future fails within the
// publish-async timeout with an error the session sends again on
// (resendable, store.Unanswered), and the client no longer counts it
// pending. Without the timeout it stayed pending for good, one of the
// connection's pending slots held each time.
func TestALostAnswerLeavesThePendingPublishes(t *testing.T) {
	t.Parallel()
	_, nc, _, _, _ := storetest.StartStream(t, store.StreamConfig{Partitions: 1})
	sub, err := nc.SubscribeSync("lost.answer") // receives, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	js, err := newJetStreamWithin(nc, 200*time.Millisecond) // newJetStream's, shortened
	if err != nil {
		t.Fatal(err)
	}
	f, err := js.PublishMsgAsync(&nats.Msg{Subject: "lost.answer", Data: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-f.Ok():
		t.Fatalf("answered: %+v", a)
	case err := <-f.Err():
		if !errors.Is(err, jetstream.ErrAsyncPublishTimeout) || !resendable(err) || !store.Unanswered(err) || !store.Transient(err) {
			t.Fatalf("answer %v: want the publish-async timeout, resendable, unanswered and transient", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the future of a publish whose answer was lost never resolved")
	}
	if n := js.PublishAsyncPending(); n != 0 {
		t.Fatalf("%d publishes pending, want 0", n)
	}
}
