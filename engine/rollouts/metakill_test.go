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

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine/rollouts"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/rollout/fleetfile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestIdleControllerReadsOnWhenTheMetaLeaderDiesWithTheStreams is a
// fresh user's finding M1 on a 3-server cluster of nats-server
// processes: the one server leading both the stream and the cluster's
// meta group killed with SIGKILL while the fleet's controller was idle,
// then a rollout applied. The controller, woken by the stream's new
// leader, must make its new consumer as soon as the cluster has a meta
// leader to answer it, and publish the new rollout's wants then. Before,
// its consumer's creation was asked once, while no meta leader could
// answer it, and waited out the client's whole API timeout (5 s)
// silent; the run then failed and was started again a second later: the
// wants went out 11.7 s after the apply was stored, 22 s after the kill.
//
// The test asserts no time: the wants must go out (a 2 minute backstop,
// no step of which is timed), and the kill→apply, kill→meta leader and
// kill→wants figures are logged for the notes. Whether a creation is
// sent while the meta group is leaderless depends on which election
// ends first, so the re-ask itself is asserted by
// TestAnUnansweredConsumerCreationIsAskedAgain, which fails without it.
func TestIdleControllerReadsOnWhenTheMetaLeaderDiesWithTheStreams(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills a server of a cluster: not in -short")
	}
	pc := storetest.StartProcCluster(t, 3)
	_, js := pc.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	stream, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	subj := cfg.Subjects()
	pc.AwaitLeader(t, ctx, js, cfg.Name, 30*time.Second)
	// Both leaders on one server: the stream's moved to the meta
	// leader's.
	meta := waitfor.Value(t, 30*time.Second, "a meta leader", func() (int, bool) { m := pc.MetaLeader(); return m, m >= 0 })
	if err := pc.MoveLeader(ctx, js, cfg.Name, meta); err != nil {
		t.Fatal(err)
	}
	other := (meta + 1) % pc.N()
	_, cjs := pc.ConnectVia(t, other)
	_, vjs := pc.ConnectVia(t, (meta+2)%pc.N())

	const n = 6
	pub := store.NewPublisher(js, subj)
	var nodes strings.Builder
	for i := range n {
		node := fmt.Sprintf("n%02d", i)
		if _, err := pub.Append(ctx, node, events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now())); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&nodes, "  %s: {}\n", node)
	}
	plan := func(build string) *feed.Plan {
		t.Helper()
		f, _, err := fleetfile.Parse(fmt.Appendf(nil, "fleet: web\nnodes:\n%sgroups: [{name: all, select: {}, modules: [{name: web, build: %q}]}]\n"+
			"rollout: {canary: 2, batch: 2, max_unavailable: 2}\n", nodes.String(), build))
		if err != nil {
			t.Fatal(err)
		}
		p, err := feed.NewPlan(ctx, feed.WithLeaderWants(stream, js), subj, f, "alice", "")
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// A first rollout, aborted: the controller refolds it and idles.
	id1, err := plan("web:2").Apply(ctx, js, subj)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := feed.Publish(ctx, js, subj, "web", rollout.KindAbort, rollout.NewOperator(rollout.KindAbort, id1, "alice", ""), ""); err != nil {
		t.Fatal(err)
	}
	next := plan("web:3") // read before the kill: the apply is stored after it

	logged := &lines{t: t}
	cctx, stopC := context.WithCancel(ctx)
	cdone := make(chan error, 1)
	go func() {
		cdone <- rollouts.Run(cctx, cjs, rollouts.Config{Stream: cfg, Logger: slog.New(logged)})
	}()
	defer func() {
		stopC()
		if err := <-cdone; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitfor.Until(t, time.Minute, "the controller idle", func() bool { return logged.has("rollout controller idle") })
	if now := pc.MetaLeader(); now != meta {
		t.Skipf("the meta leader moved from %s to %s meanwhile", pc.Name(meta), pc.Name(now))
	}
	if now := pc.Leader(ctx, js, cfg.Name); now != meta {
		t.Skipf("the stream's leader moved from %s to %s meanwhile", pc.Name(meta), pc.Name(now))
	}
	pc.Kill(meta)
	killed := time.Now()
	t.Logf("killed %s, leading the stream and the meta group", pc.Name(meta))

	// The meta leader's return, as the test sees it (for the figures).
	var metaBack time.Duration
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := waitfor.Poll(ctx, "a new meta leader", func() (int, bool) { m := pc.MetaLeader(); return m, m >= 0 && m != meta }); err == nil {
			metaBack = time.Since(killed)
		}
	}()
	// Applied once the controller was woken (the user's apply came 9.8 s
	// after the kill, after the stream's election).
	waitfor.Until(t, time.Minute, "the controller woken", func() bool { return logged.has("rollout controller woken") })
	t.Logf("the controller woken %s after the kill", time.Since(killed).Round(10*time.Millisecond))
	id2, err := store.RideOut(store.WithRideOut(ctx, time.Minute), cfg.Name, func(ctx context.Context) (uint64, error) {
		return next.Apply(ctx, vjs, subj)
	})
	if err != nil {
		t.Fatal(err)
	}
	applied := time.Since(killed)
	canary := []string{"n00", "n01"}
	waitfor.Until(t, 2*time.Minute, "the new rollout's canary wants published", func() bool {
		for _, node := range canary {
			m, err := store.LastMsg(ctx, store.Leader(vjs, cfg.Name), subj, node, events.KindWant)
			if err != nil || m.MsgID != rollout.WantID("web", id2, node, rollout.StepForward) {
				return false
			}
		}
		return true
	})
	wants := time.Since(killed)
	wg.Wait()
	t.Logf("figures: kill→apply stored %s, kill→meta leader seen %s, kill→canary wants published %s",
		applied.Round(10*time.Millisecond), metaBack.Round(10*time.Millisecond), wants.Round(10*time.Millisecond))
}

// lines logs every line to the test and keeps them all.
type lines struct {
	t    *testing.T
	mu   sync.Mutex
	msgs []string
}

func (l *lines) Enabled(context.Context, slog.Level) bool { return true }
func (l *lines) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	l.t.Logf("%s %s %s%s", r.Time.Format("15:04:05.000"), r.Level, r.Message, b.String())
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message)
	l.mu.Unlock()
	return nil
}
func (l *lines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *lines) WithGroup(string) slog.Handler      { return l }

// has reports whether a line logged so far holds s.
func (l *lines) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.msgs {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// TestAnUnansweredConsumerCreationIsAskedAgain: a consumer creation the
// controller sends while the cluster has no meta leader is never
// answered, not even once one is elected (nats-server answers only the
// asks its meta leader receives). The controller, woken (here by an
// apply) while no meta leader could answer, must ask again on its own,
// within its attempt, and publish the apply's wants once a creation is
// answered: before, it asked once, with no bound of its own, and the
// fresh user's M1 waited out the client's API timeout and a restart.
// The ask sent while leaderless is left unanswered for good (the client's
// own 5 s timeout is not played: a controller that leaves its ask to it
// fails the test's deadline here), and the ones after it are answered.
func TestAnUnansweredConsumerCreationIsAskedAgain(t *testing.T) {
	// Not parallel: it sets followTail, every controller's.
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	subj := cfg.Subjects()
	pub := store.NewPublisher(js, subj)
	for _, n := range []string{"ace", "bob"} {
		if _, err := pub.Append(ctx, n, events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	apply := func(build string) uint64 {
		t.Helper()
		f, _, err := fleetfile.Parse(fmt.Appendf(nil, "fleet: web\nnodes: {ace: {}, bob: {}}\n"+
			"groups: [{name: all, select: {}, modules: [{name: web, build: %q}]}]\nrollout: {canary: 1}\n", build))
		if err != nil {
			t.Fatal(err)
		}
		plan, err := feed.NewPlan(ctx, feed.WithLeaderWants(stream, js), subj, f, "alice", "")
		if err != nil {
			t.Fatal(err)
		}
		id, err := plan.Apply(ctx, js, subj)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	id1 := apply("web:2")
	if _, err := feed.Publish(ctx, js, subj, "web", rollout.KindAbort, rollout.NewOperator(rollout.KindAbort, id1, "alice", ""), ""); err != nil {
		t.Fatal(err)
	}

	var (
		leaderless atomic.Bool
		unanswered = make(chan struct{}, 16) // one per ask left unanswered
	)
	defer rollouts.SetFollowTail(func(ctx context.Context, js jetstream.JetStream, tc store.TailConfig) (*store.Tail, error) {
		if leaderless.Load() {
			unanswered <- struct{}{}
			<-ctx.Done() // never answered: only the asker gives up
			return nil, fmt.Errorf("consumer on %s: %w", tc.Stream, ctx.Err())
		}
		return store.Follow(ctx, js, tc)
	})()

	logged := &lines{t: t}
	cctx, stopC := context.WithCancel(ctx)
	cdone := make(chan error, 1)
	go func() {
		cdone <- rollouts.RunFleet(cctx, js, rollouts.Config{Stream: cfg, Logger: slog.New(logged)}, "web")
	}()
	defer func() {
		stopC()
		if err := <-cdone; err != nil {
			t.Errorf("RunFleet: %v", err)
		}
	}()
	waitfor.Until(t, 30*time.Second, "the controller idle", func() bool { return logged.has("rollout controller idle") })

	leaderless.Store(true)
	id2 := apply("web:3")
	select {
	case <-unanswered:
	case <-ctx.Done():
		t.Fatal("the controller, woken by the apply, asked for no consumer")
	}
	leaderless.Store(false) // a meta leader elected: the asks after this are answered
	msgID := rollout.WantID("web", id2, "ace", rollout.StepForward)
	waitfor.Until(t, 30*time.Second, "the apply's canary want published", func() bool {
		m, err := store.LastMsg(ctx, stream, subj, "ace", events.KindWant)
		return err == nil && m.MsgID == msgID
	})
	if !logged.has("its consumer's creation is unanswered: waiting for") {
		t.Errorf("the controller did not say it waited for its consumer's creation")
	}
}
