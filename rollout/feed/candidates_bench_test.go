package feed_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/rollout/fleetfile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// BenchmarkCandidates60 reads the candidates of a fleet of 60 nodes, each
// with a want, a have and an agent event, from an R3 stream on three
// in-process servers over loopback: apply's read before it publishes
// (a fresh user's finding G0: 2.9–14.4 s at load 44, one request at a
// time).
func BenchmarkCandidates60(b *testing.B) {
	_, _, js, stream, cfg := storetest.StartClusterStream(b, 3, store.StreamConfig{Replicas: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	subj := cfg.Subjects()
	pub := store.NewPublisher(js, subj)
	var file strings.Builder
	file.WriteString("fleet: web\nnodes:\n")
	for i := range 60 {
		n := fmt.Sprintf("n%02d", i)
		fmt.Fprintf(&file, "  %s: {}\n", n)
		for _, p := range []events.Payload{
			&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}},
			&events.Agent{State: events.AgentUp, Claim: "c1"},
			&events.Have{Modules: []events.HaveModule{{Name: "web", Build: "web:1", State: events.Running, Health: events.Healthy}}},
		} {
			if _, err := pub.Append(ctx, n, events.Stamp(p, time.Now())); err != nil {
				b.Fatal(err)
			}
		}
	}
	file.WriteString("groups: [{name: all, select: {}, modules: [{name: web, build: \"web:2\"}]}]\n")
	f, _, err := fleetfile.Parse([]byte(file.String()))
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := feed.Candidates(ctx, stream, subj, f); err != nil {
			b.Fatal(err)
		}
	}
}
