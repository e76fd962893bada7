package feed_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/rollout/fleetfile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// The candidates of a fleet of 30 nodes, read several nodes at a time,
// come in the fleet file's order, each with its own newest want, agent
// state, pause, retire and unhealthy modules; a read that runs out of
// the caller's deadline says which node and which read it was (a fresh
// user's finding G0: "last message on 0.mesh.n03.want: context deadline
// exceeded", and no more).
func TestCandidatesReadEachNodeAndNameAFailedRead(t *testing.T) {
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subj := cfg.Subjects()
	pub := store.NewPublisher(js, subj)
	appendEv := func(node string, p events.Payload) {
		t.Helper()
		if _, err := pub.Append(ctx, node, events.Stamp(p, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	var nodes []string
	var file strings.Builder
	file.WriteString("fleet: web\nnodes:\n")
	for i := range 30 {
		n := fmt.Sprintf("n%02d", i)
		nodes = append(nodes, n)
		fmt.Fprintf(&file, "  %s: {}\n", n)
		if i%5 == 4 {
			continue // no event: a new node
		}
		appendEv(n, &events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:" + n}}})
		health := events.Healthy
		if i%3 == 0 {
			health = events.Unhealthy
		}
		appendEv(n, &events.Have{Modules: []events.HaveModule{{Name: "web", Build: "web:" + n, State: events.Running, Health: health}}})
		switch i % 4 {
		case 1:
			appendEv(n, &events.Agent{State: events.AgentDown, Claim: "c1", Why: events.WhyExpired})
		case 2:
			appendEv(n, &events.Pause{By: "ops", Reason: "disk"})
		case 3:
			appendEv(n, &events.Retire{By: "ops"})
		}
	}
	file.WriteString("groups: [{name: all, select: {}, modules: [{name: web, build: \"web:2\"}]}]\n")
	f, _, err := fleetfile.Parse([]byte(file.String()))
	if err != nil {
		t.Fatal(err)
	}
	cands, err := feed.Candidates(ctx, stream, subj, f)
	if err != nil {
		t.Fatal(err)
	}
	if len(cands) != len(nodes) {
		t.Fatalf("%d candidates, want %d", len(cands), len(nodes))
	}
	for i, c := range cands {
		if c.Node != nodes[i] {
			t.Fatalf("candidate %d is %s, want %s (the fleet file's order)", i, c.Node, nodes[i])
		}
		if i%5 == 4 {
			if c.Prev != 0 || c.Current != nil || c.Down || c.PausedBy != "" || c.Retired || c.Unhealthy != nil {
				t.Errorf("%s, no event: %+v", c.Node, c)
			}
			continue
		}
		if c.Prev == 0 || len(c.Current) != 1 || c.Current[0].Build != "web:"+c.Node {
			t.Errorf("%s: current want #%d %+v, want its own web:%s", c.Node, c.Prev, c.Current, c.Node)
		}
		if got, want := c.Unhealthy != nil, i%3 == 0; got != want || (got && !slices.Equal(c.Unhealthy, []string{"web"})) {
			t.Errorf("%s: unhealthy %v, want web unhealthy: %v", c.Node, c.Unhealthy, want)
		}
		if c.Down != (i%4 == 1) || (c.PausedBy == "ops") != (i%4 == 2) || c.Retired != (i%4 == 3) {
			t.Errorf("%s: down %v, paused by %q, retired %v (i%%4 = %d)", c.Node, c.Down, c.PausedBy, c.Retired, i%4)
		}
	}

	past, cancelPast := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancelPast()
	_, err = feed.Candidates(past, stream, subj, f)
	var re *feed.ReadError
	if !errors.As(err, &re) || !slices.Contains(nodes, re.Node) || re.What != "newest want" || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read past its deadline: %v (%#v), want a *feed.ReadError naming a node of the fleet and its newest want, wrapping the deadline", err, re)
	}
	if !strings.Contains(err.Error(), "reading node "+re.Node+"'s newest want") {
		t.Errorf("the error does not say the node and the read: %v", err)
	}
}

// The held wants of the nodes whose want subject holds none are asked
// several at a time: held here answers only once four asks are in
// flight at once, which asks made one after another never reach (a
// fresh user's finding, fresh13 G2: an apply of 185 nodes new to a
// reconciler group asked them one by one, each waiting for its answer,
// and ran out of its --timeout).
func TestCandidatesAskTheHeldWantsAtOnce(t *testing.T) {
	t.Parallel()
	_, _, _, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	var file strings.Builder
	file.WriteString("fleet: web\nnodes:\n")
	for i := range 12 {
		fmt.Fprintf(&file, "  new-%d: {}\n", i)
	}
	file.WriteString("groups: [{name: all, select: {}, modules: [{name: web, build: \"web:2\"}]}]\n")
	f, _, err := fleetfile.Parse([]byte(file.String()))
	if err != nil {
		t.Fatal(err)
	}
	const together = 4
	var (
		mu      sync.Mutex
		waiting int
		asked   = map[string]bool{}
	)
	all := make(chan struct{})
	held := func(ctx context.Context, node string) (uint64, []events.WantModule, error) {
		mu.Lock()
		asked[node] = true
		if waiting++; waiting == together {
			close(all)
		}
		mu.Unlock()
		select {
		case <-all:
			return 0, nil, nil
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cands, err := feed.CandidatesHeld(ctx, stream, cfg.Subjects(), f, held)
	if err != nil {
		t.Fatalf("no %d held wants asked at once: %v", together, err)
	}
	if len(cands) != 12 || len(asked) != 12 {
		t.Errorf("%d candidates, %d nodes asked; want 12 of each", len(cands), len(asked))
	}
}
