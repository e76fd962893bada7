package rollouts

import (
	"context"
	"log/slog"
	"strings"
	"sync"
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

// lines keeps the messages logged at warn or above.
type lines struct {
	mu   sync.Mutex
	msgs []string
}

func (l *lines) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l *lines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	return nil
}
func (l *lines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *lines) WithGroup(string) slog.Handler      { return l }
func (l *lines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msgs...)
}

// A rollout event, and a step's want, published and unanswered when the
// controller's connection is lost (its server gone: here a proxy drops
// the connection, having kept what the client sent since it held it)
// fail with nats.ErrDisconnected, every asynchronous publish pending at a
// reconnect does. That passes (store.Transient): each is sent again once
// the connection is back, under its id, and stored. Before, the drain
// logged the event "not stored: skipped" and lost it, and the step's
// want was refused with "server is disconnected".
func TestAReconnectLosesNoRolloutEvent(t *testing.T) {
	t.Parallel()
	e, _, _, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	subj := cfg.Subjects()
	logged := &lines{}
	c := &controller{cfg: Config{Stream: cfg, Logger: slog.New(logged)}.withDefaults(), js: js, subj: subj, fleet: "web",
		pub: store.NewPublisher(js, subj), state: rollout.NewState("web")}
	c.log = c.cfg.Logger
	last := func(k rollout.Kind) (jetstream.RawStreamMsg, bool) {
		t.Helper()
		m, err := stream.GetLastMsgForSubject(ctx, subj.Rollout("web", string(k)))
		if err != nil {
			return jetstream.RawStreamMsg{}, false
		}
		return *m, true
	}
	// lost sends what run does while the proxy holds what it sends, drops
	// the connection once subject was sent, and waits for run's end.
	lost := func(what, subject string, run func()) {
		t.Helper()
		// Connected (through the proxy, its CONNECT delivered) before
		// the hold: a reconnect under way would be held too.
		waitfor.Until(t, 20*time.Second, "the connection back", func() bool { return nc.FlushTimeout(time.Second) == nil })
		px.Hold()
		done := make(chan struct{})
		go func() {
			defer close(done)
			run()
		}()
		waitfor.Until(t, 20*time.Second, what+" sent to the held connection", func() bool { return px.Holds(subject) })
		px.Drop()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: not carried out 30 s after the connection's loss", what)
		}
	}

	// A rollout event appended without waiting, in flight at the loss,
	// then drained.
	lost("a tick", subj.Rollout("web", string(rollout.KindTick)), func() {
		c.appendAsync(ctx, rollout.KindTick, &rollout.Tick{Rollout: 1}, "tick-1")
		c.drain(ctx)
	})
	if m, ok := last(rollout.KindTick); !ok || m.Header.Get(jetstream.MsgIDHeader) != "tick-1" {
		t.Fatalf("the tick in flight at the reconnect is not stored (%v); logged %q", ok, logged.all())
	}

	// A step's want carried out, in flight at the loss: stored, and its
	// outcome recorded as published.
	step := rollout.Effect{Fleet: "web", Want: &rollout.WantEffect{Rollout: 1, Node: "ace", Step: rollout.StepForward,
		Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}}
	lost("a step's want", subj.Event("ace", events.KindWant), func() {
		c.carry(ctx, []rollout.Effect{step})
		c.drain(ctx)
	})
	w, err := store.LastMsg(ctx, stream, subj, "ace", events.KindWant)
	if err != nil || w.MsgID != step.ID() {
		t.Fatalf("ace's want: %q (%v), want the step's %q; logged %q", w.MsgID, err, step.ID(), logged.all())
	}
	if _, ok := last(rollout.KindRefused); ok {
		t.Fatalf("the step's want was refused; logged %q", logged.all())
	}
	m, ok := last(rollout.KindPublished)
	if !ok {
		t.Fatalf("the step's want is not recorded published; logged %q", logged.all())
	}
	p, err := rollout.Decode(rollout.KindPublished, m.Data)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.(*rollout.Published); got.Node != "ace" || got.Want != w.Event.Seq {
		t.Fatalf("recorded published: %+v, want ace's want at #%d", got, w.Event.Seq)
	}
	for _, l := range logged.all() {
		if strings.Contains(l, "skipped") || strings.Contains(l, "refused") {
			t.Errorf("logged %q", l)
		}
	}
}
