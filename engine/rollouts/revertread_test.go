package rollouts

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// said keeps the controller's lines at info and above, with their
// level.
type said struct {
	mu    sync.Mutex
	lines []string
}

func (s *said) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelInfo }
func (s *said) Handle(_ context.Context, r slog.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines = append(s.lines, r.Level.String()+" "+r.Message)
	return nil
}
func (s *said) WithAttrs([]slog.Attr) slog.Handler { return s }
func (s *said) WithGroup(string) slog.Handler      { return s }

// count returns how many lines contain part.
func (s *said) count(part string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range s.lines {
		if strings.Contains(l, part) {
			n++
		}
	}
	return n
}

func (s *said) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...)
}

// A revert's read of the want it gives back (the node's want before the
// rollout, copied) that fails while the controller's server is away is asked again
// until it is read; it was asked again silently, so a revert that waited
// said nothing of what for. Now the controller says once, at WARN, what
// it waits for, and at INFO when the want was read. The server's loss is
// a proxy that holds what the controller sends (no answer comes: each
// read rides it out for its bound, 300 ms here) and then drops the
// connection, which the controller's connection gets back.
func TestRevertReadSaysWhatItWaitsFor(t *testing.T) {
	// Not parallel: it sets leaderGetMsg, every controller's.
	e, _, pjs, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	subj := cfg.Subjects()
	old := []events.WantModule{{Name: "web", Build: "web:1"}}
	prev, err := store.NewPublisher(pjs, subj).Append(ctx, "ace", events.Stamp(&events.Want{Modules: old}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	px := storetest.StartProxy(t, strings.TrimPrefix(e.ClientURL(), "nats://"))
	nc, err := nats.Connect(px.URL(), nats.ReconnectWait(20*time.Millisecond), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	logged := &said{}
	c := &controller{cfg: Config{Stream: cfg, Logger: slog.New(logged)}.withDefaults(), js: js, subj: subj, fleet: "web",
		pub: store.NewPublisher(js, subj), state: rollout.NewState("web")}
	c.log = c.cfg.Logger
	revert := rollout.Effect{Fleet: "web", Want: &rollout.WantEffect{Rollout: 1, Node: "ace", Step: rollout.StepRevert, CopyOf: prev.Seq}}

	var reads atomic.Int64
	read := leaderGetMsg
	leaderGetMsg = func(ctx context.Context, l *store.LeaderReads, seq uint64) (*jetstream.RawStreamMsg, error) {
		reads.Add(1)
		return read(ctx, l, seq)
	}
	defer func() { leaderGetMsg = read }()

	waiting, passed := "waiting for ", "a revert's read of the want it gives back passed"
	waitfor.Until(t, 20*time.Second, "the connection up", func() bool { return nc.FlushTimeout(time.Second) == nil })
	px.Hold()
	type result struct {
		w   *events.Want
		err error
	}
	done := make(chan result, 1)
	// A context without a deadline: each read rides out its bound.
	rctx, rcancel := context.WithCancel(context.Background())
	defer rcancel()
	go func() {
		w, err := c.wantOf(store.WithRideOut(rctx, 300*time.Millisecond), revert)
		done <- result{w, err}
	}()
	// Two reads unanswered, a third under way.
	waitfor.Until(t, 20*time.Second, "the read asked a third time", func() bool { return reads.Load() >= 3 })
	if n := logged.count(waiting); n != 1 || len(logged.all()) != 1 {
		t.Fatalf("after two failed reads, logged %q; want one line saying what the read waits for", logged.all())
	}
	px.Drop()
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the read not done 30 s after the connection's loss; logged %q", logged.all())
	}
	if r.err != nil || len(r.w.Modules) != 1 || r.w.Modules[0].Build != "web:1" {
		t.Fatalf("the revert's want: %+v, %v; want ace's want #%d (web:1)", r.w, r.err, prev.Seq)
	}
	lines := logged.all()
	if logged.count(waiting) != 1 || logged.count(passed) != 1 || len(lines) != 2 ||
		!strings.HasPrefix(lines[0], "WARN ") || !strings.HasPrefix(lines[1], "INFO rollout controller: "+passed) {
		t.Fatalf("logged %q; want one WARN saying what the read waits for, then one INFO once it was read", lines)
	}
}
