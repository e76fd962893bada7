package rollouts

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
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
	if r := step(1); r.Last != hand.Seq || r.LastID != "" || !strings.Contains(r.Error, "published by hand") || calls.Load() != 4 {
		t.Fatalf("after 3 unanswered reads: refused with last %d (id %q), error %q, %d reads; want the hand's want %d, said published by hand, 4 reads",
			r.Last, r.LastID, r.Error, calls.Load(), hand.Seq)
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

// A step's want refused because another rollout's step stored the
// node's newest want: the refusal carries that want's message id
// (rollout.Refused.LastID), which the fold reads to name the writer or
// take it as the superseded rollout's, and the controller's WARN line
// says why, naming it. Before, the line said why="\"\"" (a fresh user's
// finding G2) and the refusal named no writer.
func TestARefusalNamesTheWantsWriter(t *testing.T) {
	t.Parallel()
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	subj := cfg.Subjects()
	hand, err := store.NewPublisher(js, subj).Append(ctx, "ace",
		events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:0"}}}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	// Rollout 823's canary step, stored over the hand's want.
	stepID := rollout.WantID("web", 823, "ace", rollout.StepForward)
	canary, err := store.NewPublisher(js, subj).Append(ctx, "ace",
		events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now()),
		store.WithMsgID(stepID), store.WithExpectLastSubjectSeq(hand.Seq))
	if err != nil {
		t.Fatal(err)
	}
	logged := &attrs{}
	c := &controller{cfg: Config{Stream: cfg, Logger: slog.New(logged)}.withDefaults(), js: js, subj: subj, fleet: "web",
		pub: store.NewPublisher(js, subj), state: rollout.NewState("web")}
	c.log = c.cfg.Logger
	// Rollout 828's step, decided against the hand's want.
	c.publishWant(ctx, rollout.Effect{Fleet: "web", Want: &rollout.WantEffect{Rollout: 828, Node: "ace", Step: rollout.StepForward, Expect: hand.Seq,
		Modules: []events.WantModule{{Name: "web", Build: "web:2"}}}})
	c.drain(ctx)
	m, err := stream.GetLastMsgForSubject(ctx, subj.Rollout("web", string(rollout.KindRefused)))
	if err != nil {
		t.Fatalf("no refusal: %v", err)
	}
	p, err := rollout.Decode(rollout.KindRefused, m.Data)
	if err != nil {
		t.Fatal(err)
	}
	r := p.(*rollout.Refused)
	if r.Last != canary.Seq || r.LastID != stepID || !strings.Contains(r.Error, "rollout 823 of fleet web, its forward step") {
		t.Fatalf("refused with last %d (id %q), error %q; want #%d, id %s, the error naming rollout 823's step", r.Last, r.LastID, r.Error, canary.Seq, stepID)
	}
	why := logged.get("rollout want refused", "why")
	if !strings.Contains(why, "rollout 823") || !strings.Contains(why, fmt.Sprintf("#%d", hand.Seq)) {
		t.Fatalf("the WARN line's why: %q; want it to name rollout 823's step and the want the step expected (#%d)", why, hand.Seq)
	}
}

// attrs keeps each log line's attributes by its message.
type attrs struct {
	mu    sync.Mutex
	lines map[string]map[string]string
}

func (a *attrs) Enabled(context.Context, slog.Level) bool { return true }
func (a *attrs) Handle(_ context.Context, r slog.Record) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lines == nil {
		a.lines = map[string]map[string]string{}
	}
	m := map[string]string{}
	r.Attrs(func(at slog.Attr) bool { m[at.Key] = at.Value.String(); return true })
	a.lines[r.Message] = m
	return nil
}
func (a *attrs) WithAttrs([]slog.Attr) slog.Handler { return a }
func (a *attrs) WithGroup(string) slog.Handler      { return a }

// get is attribute key of the newest line logged with message msg.
func (a *attrs) get(msg, key string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lines[msg][key]
}
