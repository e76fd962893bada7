package rollouts

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A step's want the server refuses as a conflict while the want the
// step was decided against is still the node's newest is sent again
// under the same id and expectation, and recorded published: a new
// leader right after a stepdown answered such a refusal (twice in ~19
// runs of 6 stepdowns). Before, it was recorded refused, which reads as a
// want changed by hand and fails the target. The refusal is injected:
// the server stores the copy, whose expectation holds.
func TestAStaleConflictIsSentAgain(t *testing.T) {
	t.Parallel()
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	subj := cfg.Subjects()
	logged := &lines{}
	c := &controller{cfg: Config{Stream: cfg, Logger: slog.New(logged)}.withDefaults(), js: js, stream: stream, subj: subj, fleet: "web",
		pub: store.NewPublisher(js, subj), state: rollout.NewState("web")}
	c.log = c.cfg.Logger

	before, err := c.pub.Append(ctx, "ace", events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now().UTC()))
	if err != nil {
		t.Fatal(err)
	}
	e := rollout.Effect{Fleet: "web", Want: &rollout.WantEffect{Rollout: 7, Node: "ace", Step: rollout.StepForward,
		Modules: []events.WantModule{{Name: "web", Build: "web:2"}}, Expect: before.Seq}}
	stale := store.ServerError(&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant,
		Description: "wrong last sequence: 3"})
	c.outcome(ctx, e, 0, stale)
	c.drain(ctx)

	w, err := store.LastMsg(ctx, stream, subj, "ace", events.KindWant)
	if err != nil {
		t.Fatal(err)
	}
	if w.MsgID != e.ID() {
		t.Fatalf("ace's newest want is %q at #%d; want the step's %q sent again", w.MsgID, w.Event.Seq, e.ID())
	}
	if _, err := stream.GetLastMsgForSubject(ctx, subj.Rollout("web", string(rollout.KindRefused))); err == nil {
		t.Fatal("the step was recorded refused")
	}
	pub, err := stream.GetLastMsgForSubject(ctx, subj.Rollout("web", string(rollout.KindPublished)))
	if err != nil {
		t.Fatalf("the step was not recorded published: %v", err)
	}
	p, err := rollout.Decode(rollout.KindPublished, pub.Data)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.(*rollout.Published); got.Node != "ace" || got.Want != w.Event.Seq {
		t.Fatalf("recorded published: %+v; want ace's want #%d", got, w.Event.Seq)
	}
}
