package engine

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// An instance whose watch lags behind the bucket judges from a lease
// view another instance has recorded past: c3's claim is in its view
// while the stream's newest agent event is c3's down. A claim recorded
// down as released or replaced is over (its agent never writes that
// lease again): no second up is recorded for it. One recorded down as
// expired may be claimed again by its agent (store.Lease claims its
// expired key again with the same token): its up is recorded again.
// Under -race on a loaded machine TestAgentLiveness recorded "up c3"
// after "down c3 released", then c3's release a second time.
func TestAgentStaleViewRecordsNoSecondUp(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		why     events.AgentWhy
		deleted bool // the bucket holds the release, not c3's lease
		want    []string
	}{
		{events.WhyReleased, true, []string{"up c3", "down c3 released"}},
		{events.WhyReplaced, false, []string{"up c3", "down c3 replaced"}},
		{events.WhyExpired, false, []string{"up c3", "down c3 expired", "up c3"}},
	} {
		t.Run(string(c.why), func(t *testing.T) {
			_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{Partitions: 2})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			kv, err := store.CreateKV(ctx, js, jetstream.KeyValueConfig{Bucket: cfg.Name + store.NodeLeaseBucketSuffix,
				History: 1, TTL: time.Minute, Storage: jetstream.FileStorage})
			if err != nil {
				t.Fatal(err)
			}
			h := store.Holder{Role: "node", Name: "ace", Host: "h1", PID: 2, Token: "c3"}
			v, _ := json.Marshal(h)
			rev, err := kv.Put(ctx, "ace", v)
			if err != nil {
				t.Fatal(err)
			}
			if c.deleted {
				if err := kv.Delete(ctx, "ace"); err != nil {
					t.Fatal(err)
				}
			}
			// What another instance recorded, from a newer view.
			pub := store.NewPublisher(js, cfg.Subjects())
			for _, a := range []*events.Agent{
				{State: events.AgentUp, Claim: "c3", Host: "h1", PID: 2},
				{State: events.AgentDown, Claim: "c3", Why: c.why, Host: "h1", PID: 2},
			} {
				if _, err := pub.Append(ctx, "ace", events.Stamp(a, time.Now())); err != nil {
					t.Fatal(err)
				}
			}
			w := &agentWatch{kv: kv, stream: stream, subj: cfg.Subjects(), pub: pub,
				log:    slog.New(slog.NewTextHandler(sweepTestLog{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
				leases: map[string]*nodeLease{}, last: map[string]*agentRecord{}, dirty: map[string]bool{}, now: time.Now,
				held: map[string]bool{}, ttl: time.Minute}
			// This instance's view: c3's claim, as its watch delivered it.
			w.leases["ace"] = &nodeLease{present: true, value: v, holder: h, rev: rev, seen: time.Now()}
			w.sync(ctx, "ace")
			got := agentEventsOf(ctx, t, js, cfg, "ace")
			if !slices.Equal(got, c.want) {
				t.Fatalf("ace's agent events %q, want %q", got, c.want)
			}
		})
	}
}
