package rollouts

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A step's want refused by the server as a conflict is recorded from the
// node's newest want as the stream's leader has it; a leader read that
// gets no leader's answer (a 503 while the stream's group elects one) is
// asked again, for at most leaderRideOut, before the step is refused
// with the read's error: an election no longer refuses a step's want.
func TestConflictRidesOutALeaderElection(t *testing.T) {
	// Not parallel: it sets leaderLastMsg and leaderRideOut, every controller's.
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	subj := cfg.Subjects()
	hand, err := store.NewPublisher(js, subj).Append(ctx, "ace",
		events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:0"}}}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	noLeader := &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}
	// unanswered makes the leader's read answer as a stream without a
	// leader for its first n calls.
	unanswered := func(n int64) *atomic.Int64 {
		var calls atomic.Int64
		leaderLastMsg = func(ctx context.Context, s store.LastGetter, subj events.Subjects, node string, k events.Kind) (store.Msg, error) {
			if calls.Add(1) <= n {
				return store.Msg{}, fmt.Errorf("last message on %s: %w", node, noLeader)
			}
			return store.LastMsg(ctx, s, subj, node, k)
		}
		return &calls
	}
	defer func() { leaderLastMsg = store.LastMsg }()
	// step publishes rollout id's forward want of ace, decided against no
	// want (a conflict: ace has the hand's), and returns its outcome.
	step := func(id uint64) *rollout.Refused {
		t.Helper()
		c := &controller{cfg: Config{Stream: cfg}.withDefaults(), js: js, subj: subj, fleet: "web",
			pub: store.NewPublisher(js, subj), state: rollout.NewState("web")}
		c.log = c.cfg.Logger
		c.publishWant(ctx, rollout.Effect{Fleet: "web", Want: &rollout.WantEffect{Rollout: id, Node: "ace", Step: rollout.StepForward,
			Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}})
		c.drain(ctx)
		m, err := stream.GetLastMsgForSubject(ctx, subj.Rollout("web", string(rollout.KindRefused)))
		if err != nil {
			t.Fatalf("rollout %d's step: no refusal: %v", id, err)
		}
		p, err := rollout.Decode(rollout.KindRefused, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		r := p.(*rollout.Refused)
		if r.Rollout != id {
			t.Fatalf("rollout %d's step: the newest refusal is rollout %d's", id, r.Rollout)
		}
		return r
	}

	calls := unanswered(3)
	if r := step(1); r.Last != hand.Seq || r.Error != "" || calls.Load() != 4 {
		t.Fatalf("after 3 unanswered reads: refused with last %d, error %q, %d reads; want the hand's want %d, no error, 4 reads",
			r.Last, r.Error, calls.Load(), hand.Seq)
	}
	// Bounded: past leaderRideOut the step is refused with the error.
	leaderRideOut = 300 * time.Millisecond
	defer func() { leaderRideOut = 20 * time.Second }()
	calls = unanswered(1 << 30)
	start := time.Now()
	if r := step(2); r.Last != 0 || !strings.Contains(r.Error, "temporarily unavailable") || calls.Load() < 2 {
		t.Fatalf("never answered: refused with last %d, error %q, %d reads; want the read's error after more than one", r.Last, r.Error, calls.Load())
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("never answered: refused after %v; want about leaderRideOut (300 ms)", d)
	}
}
