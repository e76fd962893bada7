package store_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A feed whose new consumer is lost again before it read for
// store.FeedSteady waits the backoff's next, longer step before its next
// consumer: every lost feed used to ask again within 100 ms of each loss,
// so a fleet whose consumers a stalling cluster kept losing asked all at
// once, again and again (a fresh user's finding M8: 300 agents, 1,100
// re-creations in 3 min). Each loss and each end of one is told to
// NodeFollow.Lost, as the agent's lease says it.
func TestFeedLostAgainSoonWaitsLonger(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	log := &recordLog{}
	handled := make(chan uint64, 8)
	type lost struct{ since time.Time }
	losts := make(chan lost, 8)
	fctx, fcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { fcancel(); wg.Wait() }()
	wg.Go(func() {
		store.FollowNode(fctx, js, store.NodeFollow{Stream: cfg, Node: "ace", Kind: events.KindKnock,
			Log: slog.New(log),
			// No jitter: the steps are 200 ms, 400 ms, 800 ms.
			Backoff: backoff.NewExponentialBackOff(backoff.WithInitialInterval(200*time.Millisecond),
				backoff.WithMultiplier(2), backoff.WithRandomizationFactor(0),
				backoff.WithMaxInterval(10*time.Second), backoff.WithMaxElapsedTime(0)),
			Lost:   func(since time.Time) { losts <- lost{since} },
			Handle: func(_ context.Context, m store.Msg) { handled <- m.Event.Payload.(*events.Knock).Cause },
		})
	})
	pub := store.NewPublisher(js, cfg.Subjects())
	if _, err := pub.Append(ctx, "ace", knock(1)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-handled: // the first consumer reads
	case <-ctx.Done():
		t.Fatal("knock 1 not read")
	}
	const losses = 3
	for i := range losses {
		infos, err := storetest.Consumers(ctx, stream)
		if err != nil || len(infos) != 1 {
			t.Fatalf("loss %d: consumers %d (%v), want the feed's one", i+1, len(infos), err)
		}
		deleted := time.Now()
		if err := stream.DeleteConsumer(ctx, infos[0].Name); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"lost", "again"} {
			select {
			case l := <-losts:
				if got := map[bool]string{true: "again", false: "lost"}[l.since.IsZero()]; got != want {
					t.Fatalf("loss %d: Lost told %q, want %q", i+1, got, want)
				}
				if want == "lost" && l.since.Before(deleted) {
					t.Errorf("loss %d: Lost since %s, before the consumer's deletion at %s", i+1, l.since, deleted)
				}
			case <-ctx.Done():
				t.Fatalf("loss %d: Lost not told %q:\n%s", i+1, want, log)
			}
		}
	}
	var waits []time.Duration
	for _, l := range strings.Split(log.String(), "\n") {
		if !strings.HasPrefix(l, "WARN knock feed lost") {
			continue
		}
		_, v, _ := strings.Cut(l, " in=")
		d, err := time.ParseDuration(strings.Fields(v)[0])
		if err != nil {
			t.Fatalf("a loss's line without its wait: %q", l)
		}
		waits = append(waits, d)
	}
	want := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond}
	if len(waits) != losses || waits[0] != want[0] || waits[1] != want[1] || waits[2] != want[2] {
		t.Errorf("the waits before each new consumer, its predecessor lost within a minute of its making: %v, want %v:\n%s", waits, want, log)
	}
}
