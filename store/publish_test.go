package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

func TestAppendDuplicateMsgID(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	pub := store.NewPublisher(js, cfg.Subjects())

	a1, err := pub.Append(ctx, "ace", journal("one"), store.WithMsgID("ace.journal.7.0"))
	if err != nil {
		t.Fatal(err)
	}
	a2, err := pub.Append(ctx, "ace", journal("one"), store.WithMsgID("ace.journal.7.0"))
	if err != nil {
		t.Fatal(err)
	}
	if a1.Duplicate || !a2.Duplicate || a2.Seq != a1.Seq {
		t.Errorf("acks = %+v, %+v; want the second a duplicate of the first", a1, a2)
	}
	if last, _ := store.StreamLastSeq(ctx, stream); last != a1.Seq {
		t.Errorf("stream last seq = %d, want %d (stored once)", last, a1.Seq)
	}
}

func TestAppendExpectLastSubjectSeq(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	pub := store.NewPublisher(js, cfg.Subjects())

	// 0: no want of ace yet. Another node's and another kind's messages
	// do not count.
	if _, err := pub.Append(ctx, "shanks", want("b0")); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Append(ctx, "ace", journal("x")); err != nil {
		t.Fatal(err)
	}
	a1, err := pub.Append(ctx, "ace", want("b1"), store.WithExpectLastSubjectSeq(0))
	if err != nil {
		t.Fatalf("first want with expectation 0: %v", err)
	}
	a2, err := pub.Append(ctx, "ace", want("b2"), store.WithExpectLastSubjectSeq(a1.Seq))
	if err != nil {
		t.Fatalf("want expecting %d: %v", a1.Seq, err)
	}
	// A controller that still thinks a1 is the newest loses.
	_, err = pub.Append(ctx, "ace", want("b3"), store.WithExpectLastSubjectSeq(a1.Seq))
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale expectation: err = %v, want ErrConflict", err)
	}
	if _, err = pub.Append(ctx, "ace", want("b3"), store.WithExpectLastSubjectSeq(0)); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("expectation 0 with a want stored: err = %v, want ErrConflict", err)
	}
	if last, _ := store.StreamLastSeq(ctx, stream); last != a2.Seq {
		t.Errorf("last seq = %d, want %d: a conflicting append was stored", last, a2.Seq)
	}

	// The async form reports the conflict on its future.
	f, err := pub.AppendAsync(ctx, "ace", want("b4"), store.WithExpectLastSubjectSeq(a1.Seq))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-f.Ok():
		t.Fatal("async append with a stale expectation was stored")
	case err := <-f.Err():
		if !errors.Is(store.ServerError(err), store.ErrConflict) {
			t.Errorf("async stale expectation: err = %v, want a conflict", err)
		}
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	f, err = pub.AppendAsync(ctx, "ace", want("b4"), store.WithExpectLastSubjectSeq(a2.Seq))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case pa := <-f.Ok():
		if pa.Sequence <= a2.Seq {
			t.Errorf("async ack seq %d", pa.Sequence)
		}
	case err := <-f.Err():
		t.Fatalf("async append: %v", err)
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
}

// TestServerErrorConflictOnlyForConflicts: only the server's two
// wrong-last-sequence replies match ErrConflict, and the reply stays
// reachable with errors.As.
func TestServerErrorConflictOnlyForConflicts(t *testing.T) {
	t.Parallel()
	for _, err := range []error{nil, errors.New("nats: wrong last sequence"), context.Canceled,
		&jetstream.APIError{Code: 404, ErrorCode: jetstream.JSErrCodeStreamNotFound}} {
		if errors.Is(store.ServerError(err), store.ErrConflict) {
			t.Errorf("%v matches ErrConflict", err)
		}
	}
	for _, code := range []jetstream.ErrorCode{jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant} {
		err := fmt.Errorf("put: %w", store.ServerError(&jetstream.APIError{Code: 400, ErrorCode: code}))
		var api *jetstream.APIError
		if !errors.Is(err, store.ErrConflict) || !errors.As(err, &api) || api.ErrorCode != code {
			t.Errorf("API error %d: %v is not a conflict wrapping the reply", code, err)
		}
	}
}

func TestAppendRefusesInvalidBeforePublishing(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	pub := store.NewPublisher(js, cfg.Subjects())

	unstamped := &events.Want{Modules: []events.WantModule{{Name: "postgres", Build: "b1"}}}
	badModule := events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "Postgres!", Build: "b1"}}}, t0)
	cases := []struct {
		name    string
		node    string
		payload events.Payload
	}{
		{"unstamped", "ace", unstamped},
		{"bad module name", "ace", badModule},
		{"bad node name", "Ace.x", want("b1")},
		{"wildcard node", "*", want("b1")},
		{"nil payload", "ace", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := pub.Append(ctx, c.node, c.payload); !errors.Is(err, events.ErrInvalid) {
				t.Errorf("Append: err = %v, want ErrInvalid", err)
			}
			if _, err := pub.AppendAsync(ctx, c.node, c.payload); !errors.Is(err, events.ErrInvalid) {
				t.Errorf("AppendAsync: err = %v, want ErrInvalid", err)
			}
		})
	}
	if last, _ := store.StreamLastSeq(ctx, stream); last != 0 {
		t.Errorf("stream last seq = %d, want 0: an invalid append was stored", last)
	}
}
