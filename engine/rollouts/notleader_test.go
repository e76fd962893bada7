package rollouts

import (
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A step's want answered "cluster can not handle request" (10009: the
// server it reached no longer leads the stream, and stored nothing of
// it) is sent again, a copy under the same message id and expected last
// subject sequence, and stored once: the answer a deposed leader gives
// is ridden out as an unanswered publish is (store.NotLeader). Before,
// the step's want was answered refused. The answer is injected: the
// nats-server of go.mod does not send it (docs/architecture.md, "A
// publish a deposed leader refuses is sent again").
func TestANotLeaderAnswerIsSentAgain(t *testing.T) {
	t.Parallel()
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	subj := cfg.Subjects()
	logged := &lines{}
	c := &controller{cfg: Config{Stream: cfg, Logger: slog.New(logged)}.withDefaults(), js: js, subj: subj, fleet: "web",
		pub: store.NewPublisher(js, subj), state: rollout.NewState("web")}
	c.log = c.cfg.Logger

	data, err := events.Encode(events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:2"}}}, time.Now().UTC()))
	if err != nil {
		t.Fatal(err)
	}
	m := &nats.Msg{Subject: subj.Event("ace", events.KindWant), Data: data, Header: nats.Header{}}
	m.Header.Set(jetstream.MsgIDHeader, "step-1")
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(0, 10)) // no want of ace yet
	errc := make(chan error, 1)
	errc <- &jetstream.APIError{Code: 500, ErrorCode: 10009, Description: "JetStream cluster can not handle request"}
	sends := []sent{{msg: m, ok: make(chan *jetstream.PubAck), errc: errc}}

	var (
		gotAck *jetstream.PubAck
		gotErr error
	)
	if !c.await(ctx, sends, func(_ int, ack *jetstream.PubAck, err error) { gotAck, gotErr = ack, err }) {
		t.Fatal("await ended with its context")
	}
	if gotErr != nil {
		t.Fatalf("the want answered 10009 was given up: %v", gotErr)
	}
	if gotAck == nil || gotAck.Duplicate {
		t.Fatalf("the want's copy: %+v, want a fresh acknowledgement", gotAck)
	}
	w, err := store.LastMsg(ctx, stream, subj, "ace", events.KindWant)
	if err != nil {
		t.Fatalf("ace's want: %v", err)
	}
	if w.MsgID != "step-1" || w.Event.Seq != gotAck.Sequence {
		t.Fatalf("ace's want: id %q at #%d, want step-1 at #%d", w.MsgID, w.Event.Seq, gotAck.Sequence)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("%d messages stored, want 1 (the copy)", info.State.Msgs)
	}
}
