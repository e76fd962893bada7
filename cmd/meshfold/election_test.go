package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestVerbsRideOutElection is a fresh user's finding V2: on a cluster, a
// publishing verb started right after a kill -9 of the stream's leader
// gave up after 10 s ("stream MESH: context deadline exceeded")
// whatever --timeout said, while the cluster elected a new leader
// (~10 s); so did the read verbs (V3). Each verb here starts right
// after such a kill and must answer as it does without one, within its
// --timeout; a verb whose --timeout ends with no leader says so (V3),
// as what it saw: no answer.
func TestVerbsRideOutElection(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: kills nats-server processes")
	}
	pc := storetest.StartProcCluster(t, 3)
	_, js := pc.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	pub := store.NewPublisher(js, cfg.Subjects())
	for _, n := range []string{"golf", "hotel"} {
		if _, err := pub.AppendRetrying(ctx, n, events.Stamp(&events.Ack{By: "setup"}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	// The verbs run as from a shell: their context has no deadline (a
	// read verb's waits are then bounded by its --timeout alone).
	cliCtx, stop := context.WithCancel(context.Background())
	defer stop()
	cli := func(args ...string) (string, string, int, time.Duration) {
		var out bytes.Buffer
		var errb storetest.SyncBuffer
		t0 := time.Now()
		code := run(cliCtx, append(args, "--server", pc.URLs()), nil, &out, &errb)
		return out.String(), errb.String(), code, time.Since(t0)
	}
	// The read verbs answer as they did before the kill: here rollout
	// status refuses a fleet with no rollout (exit 2) and fleet a stream
	// no reconciler has checkpointed (exit 1), both after reading the
	// stream.
	reads := [][]string{{"audit", "hotel"}, {"rollout", "status", "web"}, {"fleet"}}
	before := map[string]int{}
	for _, v := range reads {
		_, errs, code, _ := cli(v...)
		before[strings.Join(v, " ")] = code
		t.Logf("%v before the kill: exit %d %s", v, code, errs)
	}
	lead := pc.Leader(ctx, js, cfg.Name)
	if lead < 0 {
		t.Fatal("the stream has no leader before the kill")
	}
	pc.Kill(lead)
	killed := time.Now()
	type result struct {
		verb      []string
		out, errs string
		code      int
		took      time.Duration
	}
	verbs := append([][]string{
		{"pause", "golf", "--by", "t", "--timeout", "60s"},
		{"ack", "hotel", "--by", "t", "--force", "--timeout", "60s"},
	}, reads...)
	results := make(chan result, len(verbs))
	for _, v := range verbs {
		go func() {
			out, errs, code, d := cli(v...)
			results <- result{verb: v, out: out, errs: errs, code: code, took: d}
		}()
	}
	for range verbs {
		r := <-results
		t.Logf("%v, started right after the kill -9 of the stream leader %s: exit %d in %s", r.verb, pc.Name(lead), r.code, r.took.Round(10*time.Millisecond))
		want, read := before[strings.Join(r.verb, " ")]
		if !read {
			want = 0
		}
		if r.code != want || strings.Contains(r.errs, "deadline exceeded") || strings.Contains(r.errs, "has no leader") ||
			strings.Contains(r.errs, "did not answer") {
			t.Errorf("%v: exit %d after %s, want %d (the election is waited out)\nstdout: %s\nstderr: %s", r.verb, r.code, r.took.Round(10*time.Millisecond), want, r.out, r.errs)
		}
	}
	if _, err := store.LastMsg(ctx, store.Leader(js, cfg.Name), cfg.Subjects(), "golf", events.KindPause); err != nil {
		t.Errorf("golf's pause is not in the stream: %v", err)
	}
	now := pc.Leader(ctx, js, cfg.Name)
	t.Logf("leader now %d, %s after the kill", now, time.Since(killed).Round(10*time.Millisecond))

	// A verb whose --timeout ends before a leader is elected says so
	// plainly (finding V3: a bare "context deadline exceeded"), and
	// truly: two of the three servers killed, no leader can be
	// elected, so each wait for one (a read verb's --timeout bounds
	// each) gives up. Within 3 s of the kill the server left does not
	// yet know its groups have no leader (it notices after its raft
	// election timeout, 4–9 s in nats-server 2.15): it answers nothing,
	// neither "no leader" (10008) nor no responders, so the verb says
	// the stream did not answer within its --timeout, not that it has
	// no leader (what it said before, true only of such an answer).
	pc.Restart(lead)
	if lead = pc.Leader(ctx, js, cfg.Name); lead < 0 {
		t.Fatal("the stream has no leader before the second kill")
	}
	pc.Kill(lead)
	pc.Kill((lead + 1) % pc.N())
	// A verb that waits past that is answered "no leader", and says so.
	const noAnswer = "stream MESH did not answer within 3s (a server too busy to answer in time, or a cluster electing a leader after a server's loss?): try again, or allow longer"
	// The wait said is rounded to whole seconds: 3 s, or 4 s on a
	// machine so loaded that the verb gave up half a second late.
	noAnswerLate := strings.Replace(noAnswer, "3s", "4s", 1)
	const noLeader = "stream MESH has no leader (a cluster electing one after a server's loss?): try again in a few seconds"
	short := [][]string{{"ack", "hotel", "--by", "t", "--force", "--timeout", "3s"}, {"audit", "hotel", "--timeout", "3s"},
		{"audit", "hotel", "--timeout", "15s"}}
	done := make(chan result, len(short))
	for _, v := range short {
		go func() {
			out, errs, code, d := cli(v...)
			done <- result{verb: v, out: out, errs: errs, code: code, took: d}
		}()
	}
	for range short {
		r := <-done
		t.Logf("%v with 2 of 3 servers killed: exit %d in %s: %s", r.verb, r.code, r.took.Round(10*time.Millisecond), r.errs)
		want := noAnswer
		if slices.Contains(r.verb, "15s") {
			want = noLeader
		}
		if r.code != 1 || !(strings.Contains(r.errs, want) || want == noAnswer && strings.Contains(r.errs, noAnswerLate)) {
			t.Errorf("%v with no leader to elect: exit %d, stderr %q; want exit 1 saying %q", r.verb, r.code, r.errs, want)
		}
	}
}
