package store_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestPreparedEffectStoredWithItsHeaders pins what a prepared, signed and
// fenced effect carries as the stream stores it, now that Prepare and
// SendAsync set the message id and the expectation as headers themselves
// instead of through the client's publish options: the client's header
// names and values (an id the dedup window keys on, a fence the server
// checks), and a signature that verifies over them. A stale fence is
// refused and a second send of the same id is a duplicate, so both
// headers reach the server as the options' did.
func TestPreparedEffectStoredWithItsHeaders(t *testing.T) {
	t.Parallel()
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{Partitions: 1})
	s := newSigner(t)
	trust, err := store.NewTrust(s.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	pub := store.NewPublisher(js, cfg.Subjects())
	at := time.Date(2026, 12, 5, 15, 0, 0, 0, time.UTC)
	plan := func(cause uint64) events.Payload {
		return events.Stamp(&events.Plan{Cause: cause, Want: cause, Modules: []events.PlanModule{}}, at)
	}
	send := func(cause uint64, id string, fence uint64) (*jetstream.PubAck, error) {
		t.Helper()
		pr, err := pub.Prepare(t.Context(), "ace", plan(cause), store.WithMsgID(id), store.WithSigner(s))
		if err != nil {
			t.Fatal(err)
		}
		f, err := pub.SendAsync(pr, true, fence)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case ack := <-f.Ok():
			return ack, nil
		case err := <-f.Err():
			return nil, store.ServerError(err)
		case <-time.After(30 * time.Second):
			t.Fatal("no answer to a publish in 30 s")
			return nil, nil
		}
	}
	ack, err := send(1, "ace.plan.1.0", 0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.GetMsg(t.Context(), ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		jetstream.MsgIDHeader:               "ace.plan.1.0",
		jetstream.ExpectedLastSubjSeqHeader: "0",
		store.HeaderSigner:                  s.PublicKey(),
	}
	for k, v := range want {
		if got := m.Header.Values(k); len(got) != 1 || got[0] != v {
			t.Errorf("stored header %s = %q, want [%q]", k, got, v)
		}
	}
	// Beside what the get adds (the stream, sequence, subject and time),
	// nothing but the id, the fence and the two signature headers.
	n := 0
	for k := range m.Header {
		switch k {
		case jetstream.StreamHeader, jetstream.SequenceHeader, jetstream.SubjectHeader, jetstream.TimeStampHeaer:
		default:
			n++
		}
	}
	if n != 4 {
		t.Errorf("stored headers %v, want the id, the fence and the two signature headers", m.Header)
	}
	if err := trust.Verify("ace", events.KindPlan, m.Header, m.Data); err != nil {
		t.Errorf("the stored effect does not verify: %v", err)
	}
	if _, err := send(2, "ace.plan.2.0", 0); !errors.Is(err, store.ErrConflict) {
		t.Errorf("a send fenced at 0 behind a stored effect: %v, want ErrConflict", err)
	}
	dup, err := send(1, "ace.plan.1.0", ack.Sequence)
	if err != nil || !dup.Duplicate || dup.Sequence != ack.Sequence {
		t.Errorf("the same id sent again: %+v, %v; want a duplicate of #%d", dup, err, ack.Sequence)
	}
}

// BenchmarkSendAsync is one signed, fenced effect prepared and sent
// (store.Publisher.Prepare, then SendAsync), its acknowledgement awaited
// every 256 sends: the reconciler's publish path, with the client's
// publish and acknowledgement. Allocations an effect are the figure to
// read (-benchmem); its time is mostly the signature's and the server's.
func BenchmarkSendAsync(b *testing.B) {
	_, _, js, _, cfg := storetest.StartStream(b, store.StreamConfig{Partitions: 1})
	s := newSigner(b)
	pub := store.NewPublisher(js, cfg.Subjects())
	p := events.Stamp(&events.Plan{Cause: 1, Want: 1, Modules: []events.PlanModule{}}, time.Now())
	var pending []jetstream.PubAckFuture
	wait := func() {
		for _, f := range pending {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatal(err)
			}
		}
		pending = pending[:0]
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		pr, err := pub.Prepare(b.Context(), fmt.Sprintf("n%d", i), p, store.WithMsgID(fmt.Sprintf("n%d.plan.1.0", i)), store.WithSigner(s))
		if err != nil {
			b.Fatal(err)
		}
		f, err := pub.SendAsync(pr, true, 0)
		if err != nil {
			b.Fatal(err)
		}
		if pending = append(pending, f); len(pending) == 256 {
			wait()
		}
	}
	wait()
}
