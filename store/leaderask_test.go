package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
)

// fakeGets is a server without JetStream whose message gets of stream S
// the test answers, as the servers of a cluster do: each responder sees
// every get and answers it, or not.
type fakeGets struct {
	t    *testing.T
	nc   *nats.Conn
	js   jetstream.JetStream
	asks atomic.Int64 // gets seen by the first responder
}

const fakeGetSubject = "$JS.API.STREAM.MSG.GET.S"

func startFakeGets(t *testing.T) *fakeGets {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	f := &fakeGets{t: t}
	f.nc = f.connect(s)
	if f.js, err = jetstream.New(f.nc); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fakeGets) connect(s *server.Server) *nats.Conn {
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(nc.Close)
	return nc
}

// answer adds a responder that answers each get with reply(n), n the
// get's number as the first responder counted them (1 for the first),
// after delay; nil answers nothing.
func (f *fakeGets) answer(delay time.Duration, reply func(n int64) any) {
	f.t.Helper()
	first := f.asks.Load() == 0
	_, err := f.nc.Subscribe(fakeGetSubject, func(m *nats.Msg) {
		var n int64
		if first {
			n = f.asks.Add(1)
		} else {
			n = f.asks.Load()
		}
		r := reply(n)
		if r == nil {
			return
		}
		data, err := json.Marshal(r)
		if err != nil {
			panic(err)
		}
		time.AfterFunc(delay, func() { _ = m.Respond(data) })
	})
	if err != nil {
		f.t.Fatal(err)
	}
	if err := f.nc.Flush(); err != nil {
		f.t.Fatal(err)
	}
}

func apiError(code, errCode int, desc string) any {
	return map[string]any{"type": "io.nats.jetstream.api.v1.stream_msg_get_response",
		"error": map[string]any{"code": code, "err_code": errCode, "description": desc}}
}

func noLeader(int64) any {
	return apiError(503, 10008, "JetStream system temporarily unavailable")
}

func theMessage(int64) any {
	return map[string]any{"type": "io.nats.jetstream.api.v1.stream_msg_get_response",
		"message": map[string]any{"subject": "x", "seq": 7, "data": []byte("hi"), "time": time.Now()}}
}

// A leader read takes the leader's answer over a replica's 503: a
// replica cut off from its leader answers at once that its group has no
// leader, while the leader, a moment later, answers the message (what a
// held replica of TestLeaderReadsSeeAcknowledgedWrites did on a loaded
// machine, once its election timeout passed).
func TestLeaderReadPrefersTheLeadersAnswer(t *testing.T) {
	t.Parallel()
	f := startFakeGets(t)
	f.answer(0, noLeader)
	f.answer(20*time.Millisecond, theMessage)
	l := store.Leader(f.js, "S")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 20 {
		m, err := l.GetMsg(ctx, 7)
		if err != nil || m.Sequence != 7 || string(m.Data) != "hi" {
			t.Fatalf("GetMsg: %+v, %v; want message 7", m, err)
		}
	}
}

// A leader read rides out a stream without a leader (every replica
// answers 503, then a leader is elected) within its deadline.
func TestLeaderReadRidesOutAnElection(t *testing.T) {
	t.Parallel()
	f := startFakeGets(t)
	f.answer(0, func(n int64) any {
		if n < 4 {
			return noLeader(n)
		}
		return theMessage(n)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := store.Leader(f.js, "S").GetLastMsgForSubject(ctx, "x")
	if err != nil || m.Sequence != 7 {
		t.Fatalf("GetLastMsgForSubject: %+v, %v; want message 7", m, err)
	}
	if n := f.asks.Load(); n < 4 {
		t.Fatalf("%d asks; want 4", n)
	}
}

// Without a leader until its deadline, a read returns the server's 503
// and the deadline; a refusal or no message comes back at once, not
// asked again.
func TestLeaderReadGivesUpAtItsDeadline(t *testing.T) {
	t.Parallel()
	f := startFakeGets(t)
	f.answer(0, noLeader)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := store.Leader(f.js, "S").GetMsg(ctx, 7)
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10008 || !errors.Is(err, context.DeadlineExceeded) || !store.Unanswered(err) {
		t.Fatalf("GetMsg without a leader: %v; want the 503 and the deadline", err)
	}
	if n := f.asks.Load(); n < 2 {
		t.Fatalf("%d asks in 500 ms; want it asked again", n)
	}

	for _, c := range []struct {
		reply any
		want  func(error) bool
	}{
		{apiError(404, 10037, "no message found"), func(err error) bool { return errors.Is(err, jetstream.ErrMsgNotFound) }},
		{apiError(400, 10003, "bad request"), func(err error) bool { return errors.As(err, &apiErr) && apiErr.ErrorCode == 10003 }},
	} {
		f := startFakeGets(t)
		f.answer(0, func(int64) any { return c.reply })
		_, err := store.Leader(f.js, "S").GetMsg(context.Background(), 7)
		if !c.want(err) || store.Unanswered(err) || f.asks.Load() != 1 {
			t.Fatalf("GetMsg answered %v: %v after %d asks; want it returned after one", c.reply, err, f.asks.Load())
		}
	}
}

// ReadFilter's first read, of the filter's newest message from the
// stream's leader, rides out an election as long as the consumer's
// creation after it does (DefaultRideOut, 30 s, for a ctx without a
// deadline), not the connection's 5 s timeout: every replica answers
// "no leader" for 6 s, then the leader answers that the filter has no
// message, and the read ends without error. Before, it gave up after
// 5 s with the stream's NoLeaderError.
func TestReadFilterFirstReadRidesOutAnElection(t *testing.T) {
	t.Parallel()
	f := startFakeGets(t)
	t0 := time.Now()
	f.answer(0, func(n int64) any {
		if time.Since(t0) < 6*time.Second {
			return noLeader(n)
		}
		return apiError(404, int(jetstream.JSErrCodeMessageNotFound), "no message found")
	})
	subj := store.StreamConfig{Name: "S"}.Subjects()
	err := store.ReadFilter(context.Background(), f.js, "S", subj, "x", "x", 0, 0, func(store.Msg) error { return nil })
	if err != nil {
		t.Fatalf("ReadFilter %s after the election began: %v, want nil (no message)", time.Since(t0).Round(time.Millisecond), err)
	}
}

// A NoLeaderError says how long the asks waited in the unit a user reads:
// whole seconds from a second, never "within 0s" below one (a fresh
// user's finding: `apply --timeout 20ms` said "did not answer within 0s").
func TestNoLeaderErrorSaysItsWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		waited time.Duration
		want   string
	}{
		{3020 * time.Millisecond, "stream MESH did not answer within 3s ("},
		{150 * time.Millisecond, "stream MESH did not answer within 150ms ("},
		{3 * time.Millisecond, "stream MESH did not answer within 3ms ("},
		{200 * time.Microsecond, "stream MESH did not answer within 1ms ("},
		{0, "stream MESH did not answer ("},
	} {
		got := (&store.NoLeaderError{Stream: "MESH", Waited: tc.waited}).Error()
		if len(got) < len(tc.want) || got[:len(tc.want)] != tc.want {
			t.Errorf("waited %v: %q; want it to start %q", tc.waited, got, tc.want)
		}
	}
}
