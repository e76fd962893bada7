package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// answerWithin waits up to d for f's answer: its ack, or its error; it
// fails the test when none came.
func answerWithin(t *testing.T, f jetstream.PubAckFuture, d time.Duration) (*jetstream.PubAck, error) {
	t.Helper()
	select {
	case a := <-f.Ok():
		return a, nil
	case err := <-f.Err():
		return nil, err
	case <-time.After(d):
		t.Fatalf("no answer to the publish on %s within %v", f.Msg().Subject, d)
		return nil, nil
	}
}

// silent subscribes to every subject of prefix and never answers: a
// stream leader that took the message and died before its answer.
func silent(t *testing.T, nc *nats.Conn, prefix string) {
	t.Helper()
	sub, err := nc.SubscribeSync(prefix + ".>")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestAsyncAppendAnswered: an asynchronous append's future carries the
// stream's acknowledgement (stream, sequence), a second of the same
// message id is answered as a duplicate of the first, and a stale fence
// is the server's API error, a conflict once passed through
// ServerError.
func TestAsyncAppendAnswered(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	pub := store.NewPublisher(js, cfg.Subjects())
	f, err := pub.AppendAsync(ctx, "ace", journal("one"), store.WithMsgID("ace-1"), store.WithExpectLastSubjectSeq(0))
	if err != nil {
		t.Fatal(err)
	}
	a1, err := answerWithin(t, f, 10*time.Second)
	if err != nil || a1.Stream != cfg.Name || a1.Sequence == 0 || a1.Duplicate {
		t.Fatalf("first append: %+v, %v; want stored in %s", a1, err, cfg.Name)
	}
	f, err = pub.AppendAsync(ctx, "ace", journal("one"), store.WithMsgID("ace-1"))
	if err != nil {
		t.Fatal(err)
	}
	if a2, err := answerWithin(t, f, 10*time.Second); err != nil || !a2.Duplicate || a2.Sequence != a1.Sequence {
		t.Fatalf("same id again: %+v, %v; want a duplicate of #%d", a2, err, a1.Sequence)
	}
	f, err = pub.AppendAsync(ctx, "ace", journal("two"), store.WithMsgID("ace-2"), store.WithExpectLastSubjectSeq(0))
	if err != nil {
		t.Fatal(err)
	}
	_, err = answerWithin(t, f, 10*time.Second)
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence ||
		!errors.Is(store.ServerError(err), store.ErrConflict) {
		t.Fatalf("stale fence: %v; want the server's wrong-last-sequence error, a conflict", err)
	}
}

// TestAsyncAnswerLostTimesOut: a publish whose answer never comes (its
// one responder is silent) fails at the Publisher's ack timeout with the
// client's timeout error, which the reconciler sends again on
// (Unanswered, Transient); it leaves no pending slot behind: with one
// slot, a second publish goes out after the first timed out.
func TestAsyncAnswerLostTimesOut(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, nc, js := storetest.Start(t)
	silent(t, nc, "lost")
	pub := store.NewPublisher(js, events.Subjects{Prefix: "lost"}, store.WithAckTimeout(200*time.Millisecond), store.WithMaxPending(1))
	for i := range 2 {
		f, err := pub.AppendAsync(ctx, "ace", journal("one"))
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		_, err = answerWithin(t, f, 10*time.Second)
		if !errors.Is(err, jetstream.ErrAsyncPublishTimeout) || !store.Unanswered(err) || !store.Transient(err) || !store.Resendable(err) {
			t.Fatalf("publish %d: %v; want the publish-async timeout, unanswered, transient, resendable", i, err)
		}
	}
}

// TestAsyncStallsAtThePendingLimit: past the pending limit a send waits
// for room, and fails with the client's stall error when none comes
// (the reconciler's backpressure), nothing sent.
func TestAsyncStallsAtThePendingLimit(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, nc, js := storetest.Start(t)
	silent(t, nc, "full")
	pub := store.NewPublisher(js, events.Subjects{Prefix: "full"}, store.WithMaxPending(2))
	for i := range 2 {
		if _, err := pub.AppendAsync(ctx, "ace", journal("one")); err != nil {
			t.Fatalf("publish %d under the limit: %v", i, err)
		}
	}
	if _, err := pub.AppendAsync(ctx, "ace", journal("one")); !errors.Is(err, jetstream.ErrTooManyStalledMsgs) || !store.Resendable(err) {
		t.Fatalf("publish past the limit: %v; want the client's stall error", err)
	}
}

// TestAsyncPendingFailWhenTheConnectionIsLost: the futures pending when
// the connection loses its server fail at once with
// nats.ErrDisconnected (transient: the reconciler sends them again
// after the reconnect), not at their timeout; those pending when the
// connection closes fail with nats.ErrConnectionClosed, as does every
// later send.
func TestAsyncPendingFailWhenTheConnectionIsLost(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	srv, _, _ := storetest.Start(t)
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	silent(t, nc, "gone")
	pub := store.NewPublisher(js, events.Subjects{Prefix: "gone"}, store.WithAckTimeout(time.Hour))
	f, err := pub.AppendAsync(ctx, "ace", journal("one"))
	if err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
	if _, err := answerWithin(t, f, 10*time.Second); !errors.Is(err, nats.ErrDisconnected) || !store.Transient(err) {
		t.Fatalf("pending at the server's loss: %v; want nats.ErrDisconnected, transient", err)
	}
	// Reconnecting: the send is buffered, its answer pending.
	f, err = pub.AppendAsync(ctx, "ace", journal("two"))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if _, err := answerWithin(t, f, 10*time.Second); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Fatalf("pending at the close: %v; want nats.ErrConnectionClosed", err)
	}
	if _, err := pub.AppendAsync(ctx, "ace", journal("three")); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Fatalf("send after the close: %v; want nats.ErrConnectionClosed", err)
	}
}

// TestAsyncNoStreamResponds: a publish no stream listens to is sent
// again as the client would, then fails with jetstream.ErrNoStreamResponse
// (Unanswered).
func TestAsyncNoStreamResponds(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js := storetest.Start(t)
	pub := store.NewPublisher(js, events.Subjects{Prefix: "nobody"})
	f, err := pub.AppendAsync(ctx, "ace", journal("one"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := answerWithin(t, f, 10*time.Second); !errors.Is(err, jetstream.ErrNoStreamResponse) || !store.Unanswered(err) {
		t.Fatalf("no stream: %v; want jetstream.ErrNoStreamResponse", err)
	}
}
