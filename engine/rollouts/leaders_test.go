package rollouts_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/engine/rollouts"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/rollout/fleetfile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// The controllers of a process's fleets read the stream's leader through
// one watch: one stream info request each poll, however many fleets run.
// Each fleet's controller read its own, once a second: four fleets, four
// requests a second, for as long as their controllers lived.
func TestFleetsShareOneLeaderWatch(t *testing.T) {
	// Not parallel: it sets leaderPoll, every controller's.
	const fleets = 4
	poll := 100 * time.Millisecond
	defer rollouts.SetLeaderPoll(poll)()
	_, nc, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	subj := cfg.Subjects()
	pub := store.NewPublisher(js, subj)
	for i := range fleets {
		node := fmt.Sprintf("n%d", i)
		if _, err := pub.Append(ctx, node, events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now())); err != nil {
			t.Fatal(err)
		}
		f, _, err := fleetfile.Parse(fmt.Appendf(nil, `fleet: f%d
nodes: {%s: {}}
groups: [{name: all, select: {}, modules: [{name: web, build: "web:2"}]}]
`, i, node))
		if err != nil {
			t.Fatal(err)
		}
		plan, err := feed.NewPlan(ctx, feed.WithLeaderWants(stream, js), subj, f, "alice", "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := plan.Apply(ctx, js, subj); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var log strings.Builder
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return log.Write(p)
	}), nil))
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rollouts.Run(rctx, js, rollouts.Config{Stream: cfg, Logger: logger}) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitfor.Until(t, 30*time.Second, "every fleet's controller live", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Count(log.String(), "rollout controller live") == fleets
	})
	// Every stream info request, counted from the side: a subscriber of
	// the API subject gets a copy of each.
	var infos atomic.Int64
	sub, err := nc.Subscribe("$JS.API.STREAM.INFO."+cfg.Name, func(*nats.Msg) { infos.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	const polls = 20
	time.Sleep(polls * poll) // a window to count in, not a synchronisation
	got := infos.Load()
	t.Logf("%d stream info requests in %d polls of %d fleets' controllers", got, polls, fleets)
	// One a poll, and a few of the controllers' own (a refold's); a
	// slow machine asks fewer, never more. One watch per fleet asked
	// fleets a poll.
	if limit := int64(polls + polls/2); got > limit {
		t.Errorf("%d stream info requests in %d polls of %d fleets: more than one watch reads the leader (want at most %d)", got, polls, fleets, limit)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
