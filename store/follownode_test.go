package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A tail's messages come decoded: the event with its sequence, the
// subject, the message id, the claimed signer and the pending count; a
// subject that names no node comes with an empty kind and the reason.
func TestTailNextDecodes(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	pub := store.NewPublisher(js, cfg.Subjects())
	signer := newSigner(t)
	k, err := pub.Append(ctx, "ace", knock(1), store.WithMsgID("ace.knock.1.0"), store.WithSigner(signer))
	if err != nil {
		t.Fatal(err)
	}
	// A node name no publisher of meshfold makes, but the stream captures;
	// stored before the tail starts (acknowledged), so the first message
	// counts it pending (a core publish was now and then stored after the
	// consumer's creation under load: pending 0).
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: cfg.Prefix + ".Ace.knock", Data: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	tail, err := store.Follow(ctx, js, store.TailConfig{Stream: cfg.Name, Subjects: cfg.Subjects()})
	if err != nil {
		t.Fatal(err)
	}
	defer tail.Stop()
	m, err := tail.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.Event.Seq != k.Seq || m.Event.Node != "ace" || m.Event.Kind != events.KindKnock || m.Event.Err != nil ||
		m.MsgID != "ace.knock.1.0" || m.Signer != signer.PublicKey() || m.Pending != 1 ||
		m.Subject != cfg.Subjects().Stored("ace", events.KindKnock) {
		t.Errorf("first message = %+v, want the signed knock %d of ace, one pending", m, k.Seq)
	}
	if _, ok := m.Event.Payload.(*events.Knock); !ok {
		t.Errorf("payload = %#v, want a knock", m.Event.Payload)
	}
	bad, err := tail.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if bad.Event.Kind != "" || !errors.Is(bad.Event.Err, events.ErrBadSubject) || bad.Event.Seq != k.Seq+1 || bad.Pending != 0 {
		t.Errorf("bad subject = %+v (err %v), want an empty kind and ErrBadSubject at %d", bad.Event, bad.Event.Err, k.Seq+1)
	}
}

// FollowNode verifies each message as it arrives and hands on the newest
// accepted message of a backlog, also when the messages after it were
// refused; later messages come one by one.
func TestFollowNodeCoalescesToNewestAccepted(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	pub := store.NewPublisher(js, cfg.Subjects())
	signer := newSigner(t)
	trust, err := store.NewTrust(signer.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	publish := func(signed bool) uint64 {
		t.Helper()
		n++
		opts := []store.AppendOpt{store.WithMsgID(fmt.Sprintf("ace.knock.%d.0", n))}
		if signed {
			opts = append(opts, store.WithSigner(signer))
		}
		a, err := pub.Append(ctx, "ace", knock(uint64(n)), opts...)
		if err != nil {
			t.Fatal(err)
		}
		return a.Seq
	}
	// Another node's knock and another kind: not followed.
	if _, err := pub.Append(ctx, "shanks", knock(1), store.WithSigner(signer), store.WithMsgID("shanks.knock.1.0")); err != nil {
		t.Fatal(err)
	}
	before := publish(true)
	if _, err := pub.Append(ctx, "ace", journal("j")); err != nil {
		t.Fatal(err)
	}
	k1, k2, u3, u4 := publish(true), publish(true), publish(false), publish(false)

	handled, refused := make(chan uint64, 10), make(chan uint64, 10)
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		store.FollowNode(fctx, js, store.NodeFollow{Stream: cfg, Node: "ace", Kind: events.KindKnock, After: before,
			Verify: trust.VerifyMsg,
			Refused: func(_ context.Context, m store.Msg, err error) {
				if !errors.Is(err, store.ErrUnsigned) {
					t.Errorf("knock %d refused with %v, want ErrUnsigned", m.Event.Seq, err)
				}
				refused <- m.Event.Seq
			},
			Handle: func(_ context.Context, m store.Msg) {
				if m.Event.Kind != events.KindKnock || m.Event.Node != "ace" || m.Signer != signer.PublicKey() {
					t.Errorf("handled %+v, want a signed knock of ace", m)
				}
				handled <- m.Event.Seq
			}})
	}()
	defer func() { cancel(); <-done }()
	next := func(ch chan uint64, what string) uint64 {
		t.Helper()
		select {
		case seq := <-ch:
			return seq
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s message within 10 s", what)
			return 0
		}
	}
	if r3, r4 := next(refused, "refused"), next(refused, "refused"); r3 != u3 || r4 != u4 {
		t.Errorf("refused %d, %d, want the unsigned %d, %d", r3, r4, u3, u4)
	}
	if got := next(handled, "handled"); got != k2 {
		t.Errorf("handled %d first, want %d: the newest signed knock of the backlog (not %d, coalesced)", got, k2, k1)
	}
	k5 := publish(true)
	if got := next(handled, "handled"); got != k5 {
		t.Errorf("handled %d, want the new knock %d", got, k5)
	}
	u6 := publish(false)
	if got := next(refused, "refused"); got != u6 {
		t.Errorf("refused %d, want %d", got, u6)
	}
	// Nothing is handled for the refused knock: the next one handled is
	// the next signed one.
	if k7, got := publish(true), next(handled, "handled"); got != k7 {
		t.Errorf("handled %d after a refused knock, want the next signed one %d", got, k7)
	}
}

func knock(cause uint64) *events.Knock {
	return events.Stamp(&events.Knock{Cause: cause, Reasons: []events.KnockReason{events.KnockOperator}, Owed: []events.Owed{}}, t0)
}

// A tail with EndOnLoss ends, with ErrConsumerLost, when its consumer is
// gone, instead of recreating it: its reader follows again itself.
func TestTailEndsOnLoss(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	pub := store.NewPublisher(js, cfg.Subjects())
	for i := range 2 {
		if _, err := pub.Append(ctx, "ace", knock(uint64(i+1))); err != nil {
			t.Fatal(err)
		}
	}
	tail, err := store.Follow(ctx, js, store.TailConfig{Stream: cfg.Name, Subjects: cfg.Subjects(), Heartbeat: time.Second, EndOnLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tail.Stop()
	for i := range 2 {
		if m, err := tail.Next(ctx); err != nil || m.Event.Seq != uint64(i+1) {
			t.Fatalf("message %d: %+v, %v", i+1, m.Event, err)
		}
	}
	names := stream.ConsumerNames(ctx)
	var all []string
	for name := range names.Name() {
		all = append(all, name)
	}
	if len(all) != 1 || names.Err() != nil {
		t.Fatalf("%d consumers (%v), want the tail's one", len(all), names.Err())
	}
	if err := stream.DeleteConsumer(ctx, all[0]); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := tail.Next(ctx); !errors.Is(err, store.ErrConsumerLost) {
		t.Fatalf("after its consumer was deleted: %v, want ErrConsumerLost", err)
	}
	t.Logf("ended %v after the deletion", time.Since(start).Round(time.Millisecond))
}

// A tail with EndOnLoss also ends, with ErrConsumerLost, when the client
// ends the consumption on its own: here on a pull's status whose pending
// count it cannot read, which its error callback reports as no error the
// tail knew; the tail had waited, silent, until its reader's context ended.
func TestTailEndsWhenTheClientEndsTheConsumption(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, nc, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	pub := store.NewPublisher(js, cfg.Subjects())
	if _, err := pub.Append(ctx, "ace", knock(1)); err != nil {
		t.Fatal(err)
	}
	// The tail's pulls, seen beside the server: their reply subject is
	// where the server answers them.
	pulls, err := nc.SubscribeSync("$JS.API.CONSUMER.MSG.NEXT." + cfg.Name + ".>")
	if err != nil {
		t.Fatal(err)
	}
	defer pulls.Unsubscribe()
	tail, err := store.Follow(ctx, js, store.TailConfig{Stream: cfg.Name, Subjects: cfg.Subjects(), Heartbeat: time.Second, EndOnLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tail.Stop()
	if m, err := tail.Next(ctx); err != nil || m.Event.Seq != 1 {
		t.Fatalf("first message: %+v, %v", m.Event, err)
	}
	pull, err := pulls.NextMsgWithContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bad := nats.NewMsg(pull.Reply)
	bad.Header.Set("Status", "408")
	bad.Header.Set("Description", "Request Timeout")
	bad.Header.Set("Nats-Pending-Messages", "many")
	if err := nc.PublishMsg(bad); err != nil {
		t.Fatal(err)
	}
	// Far below the test's context: without the watch, Next returned
	// this deadline's error.
	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := tail.Next(wait); !errors.Is(err, store.ErrConsumerLost) {
		t.Fatalf("after the client ended the consumption: %v, want ErrConsumerLost", err)
	}
}
