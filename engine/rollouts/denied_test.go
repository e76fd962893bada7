package rollouts_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine/rollouts"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/rollout/fleetfile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A fleet's controller whose lease the server denies (its user may not
// write $KV.MESH_LEASES.rollout.web) says so once, at error, naming the
// subject, and is tried again each second quietly: it logged "rollout
// controller stopped; starting again" at warn every second, for ever.
func TestDeniedFleetLeaseSaidOnce(t *testing.T) {
	t.Parallel()
	const denied = "$KV.MESH_LEASES.rollout.web"
	ps := storetest.StartPermServer(t, map[string]storetest.Publish{"controller": {Deny: []string{denied}}})
	nc, js := ps.Connect(t, "controller")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	subj := cfg.Subjects()
	if _, err := store.NewPublisher(js, subj).Append(ctx, "ace", events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now())); err != nil {
		t.Fatal(err)
	}
	f, _, err := fleetfile.Parse([]byte("fleet: web\nnodes: {ace: {}}\ngroups: [{name: all, select: {}, modules: [{name: web, build: \"web:2\"}]}]\n"))
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
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: cfg.Name + "_LEASES", History: 1, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var recs []slog.Record
	logger := slog.New(recordHandler(func(r slog.Record) {
		mu.Lock()
		defer mu.Unlock()
		recs = append(recs, r.Clone())
	}))
	count := func(level slog.Level, msg string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, r := range recs {
			if r.Level == level && strings.Contains(r.Message, msg) {
				n++
			}
		}
		return n
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- rollouts.Run(rctx, js, rollouts.Config{Stream: cfg, Leases: store.LeaseBucket(kv, nc), Logger: logger})
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	// Three refused starts: the first said, the next two quiet.
	waitfor.Until(t, 30*time.Second, "the denial asked again twice", func() bool {
		return count(slog.LevelDebug, "its lease is still denied") >= 2
	})
	if n := count(slog.LevelError, "rollout controller stopped: the server denies these credentials"); n != 1 {
		t.Errorf("the denial said %d times at error, want once", n)
	}
	if n := count(slog.LevelWarn, "starting again"); n != 0 {
		t.Errorf("%d warnings of a restart for a denial", n)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, r := range recs {
		if r.Level == slog.LevelError {
			said := fmt.Sprint(r.Message)
			r.Attrs(func(a slog.Attr) bool { said += " " + a.Key + "=" + a.Value.String(); return true })
			if !strings.Contains(said, denied) {
				t.Errorf("the error line does not name %s: %s", denied, said)
			}
		}
	}
}

// recordHandler hands every record, at every level, to its func.
type recordHandler func(slog.Record)

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	h(r)
	return nil
}
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordHandler) WithGroup(string) slog.Handler      { return h }
