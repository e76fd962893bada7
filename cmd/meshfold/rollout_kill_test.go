package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/engine/rollouts/rolloutstest"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/rollout/fleetfile"
	"github.com/meshfold/meshfold/store"
)

// TestRolloutControllerKilled runs `meshfold reconcile` (the reconciler
// and the rollout controller) as its own process and kills it with
// SIGKILL at random moments, restarting it at once, across rollouts of 12
// stand-in nodes (MESHFOLD_CHAOS=full: 30 rollouts, else 6). Every rollout
// completes, and every node got exactly one want per rollout, under that
// rollout's step id: no want twice for one step, none missed.
func TestRolloutControllerKilled(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills and restarts a reconcile process: not in -short")
	}
	rounds := 6
	if os.Getenv("MESHFOLD_CHAOS") == "full" {
		rounds = 30
	}
	m := startMesh(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	key := filepath.Join(t.TempDir(), signingKeyFile)
	args := []string{"reconcile", "--server", m.e.ClientURL(), "--signing-key", key, "--log-level", "warn"}
	proc := startMeshfold(t, args...)

	actx, stopAnswer := context.WithCancel(ctx)
	answered := make(chan error, 1)
	go func() { answered <- rolloutstest.Answer(actx, m.js, m.cfg, 0, nil) }()
	defer func() {
		stopAnswer()
		if err := <-answered; err != nil {
			t.Errorf("stand-in: %v", err)
		}
	}()

	const n = 12
	nodes := make([]string, n)
	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	for i := range nodes {
		nodes[i] = fmt.Sprintf("n%02d", i)
		if _, err := pub.Append(ctx, nodes[i], events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:0"}}}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}

	stream, err := m.js.Stream(ctx, m.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	// The killer: SIGKILL at a random moment once the process has
	// stored something since its start (so that a slow start, as under
	// the race detector, is not killed over and over before it does
	// anything), then a restart at once.
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 23))
	t.Logf("seed %d", seed)
	stopKill, killed := make(chan struct{}), make(chan [2]int, 1)
	go func() {
		kills, exits := 0, 0
		defer func() { killed <- [2]int{kills, exits} }()
		// A process that ended by itself (a start that gave up, exit 1)
		// is started again, as its unit's Restart=always would, and the
		// test says so: the killer waited for the stream to move, which
		// nothing moved then, and the rollout timed out two minutes
		// later saying only that.
		exited := func() {
			exits++
			t.Logf("reconcile (pid %d) ended by itself (%s); started again. It said:\n%s",
				proc.cmd.Process.Pid, proc.cmd.ProcessState, tail(proc.stderr.String(), 2000))
			proc = startMeshfold(t, args...)
		}
	kill:
		for {
			from, err := store.StreamLastSeq(ctx, stream)
			if err != nil {
				return
			}
			for {
				select {
				case <-stopKill:
					return
				case <-proc.done:
					exited()
					continue kill
				case <-time.After(10 * time.Millisecond): // poll the stream's last sequence
				}
				if last, err := store.StreamLastSeq(ctx, stream); err == nil && last > from+2 {
					break
				}
			}
			select {
			case <-stopKill:
				return
			case <-proc.done:
				exited()
				continue kill
			case <-time.After(time.Duration(rng.IntN(200)) * time.Millisecond): // chaos: a random moment
			}
			_ = proc.cmd.Process.Signal(syscall.SIGKILL) // by pid: the process this test started
			<-proc.done
			kills++
			proc = startMeshfold(t, args...)
		}
	}()

	var ids []uint64
	began := time.Now()
	for r := 1; r <= rounds; r++ {
		var b strings.Builder
		b.WriteString("fleet: web\nnodes:\n")
		for _, nd := range nodes {
			fmt.Fprintf(&b, "  %s: {}\n", nd)
		}
		fmt.Fprintf(&b, "groups: [{name: all, select: {}, modules: [{name: web, build: \"web:%d\"}]}]\nrollout: {batch: 3, max_unavailable: 3, min_healthy: 0s, healthy_deadline: 2m}\n", r)
		f, _, err := fleetfile.Parse([]byte(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		plan, err := feed.NewPlan(ctx, stream, m.cfg.Subjects(), f, "chaos", "")
		if err != nil {
			t.Fatal(err)
		}
		id, err := plan.Apply(ctx, m.js, m.cfg.Subjects())
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		end := time.Now().Add(2 * time.Minute)
		for {
			s, err := feed.Replay(ctx, m.js, m.cfg, nil, "web")
			if err != nil && !errors.Is(err, feed.ErrNoRollout) {
				t.Fatal(err)
			}
			if s != nil && s.Rollout.ID == id && s.Rollout.Phase.Final() {
				if s.Rollout.Phase != rollout.Completed {
					t.Fatalf("rollout %d: %s: %+v", id, s.Rollout.Phase, s.View())
				}
				break
			}
			if time.Now().After(end) {
				t.Fatalf("rollout %d did not complete: %+v", id, s.View())
			}
			time.Sleep(50 * time.Millisecond) // poll the replay: the controller acts on its own
		}
	}
	close(stopKill)
	counts := <-killed
	kills, exits := counts[0], counts[1]

	// Every node: its first want by hand, then one want per rollout, each
	// under its step's id.
	for _, nd := range nodes {
		var got []string
		err := store.ReadNode(ctx, m.js, m.cfg.Name, m.cfg.Subjects(), nd, 0, 0, func(msg store.Msg) error {
			if msg.Event.Kind == events.KindWant {
				got = append(got, msg.MsgID)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		want := []string{""}
		for _, id := range ids {
			want = append(want, rollout.WantID("web", id, nd, rollout.StepForward))
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s: wants %q, want %q", nd, got, want)
		}
	}
	t.Logf("%d rollouts of %d nodes, controller killed -9 %d times (ended by itself %d times): every want once, none missed, in %s",
		rounds, n, kills, exits, time.Since(began).Round(time.Millisecond))
}

// TestRolloutAgentKilledMidRollout: three real node agents (`meshfold
// node`, the recording runtime); once the rollout has begun, one is
// killed with SIGKILL before its batch. Its lease expires, its agent
// event says down, and its target holds nothing back: the rollout
// completes with it unreached at its healthy_deadline. Restarted, the
// agent takes its newest want: the rollout's.
func TestRolloutAgentKilledMidRollout(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs and kills node agent processes: not in -short")
	}
	m := startMesh(t)
	trust := m.serveSigned(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stream, err := m.js.Stream(ctx, m.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	subj := m.cfg.Subjects()
	dir := t.TempDir()
	agent := func(node string) *meshfoldProcess {
		return startMeshfold(t, "node", node, "--runtime", "record", "--root", filepath.Join(dir, node),
			"--state-dir", filepath.Join(dir, node+"-state"), "--server", m.e.ClientURL(), "--trust", trust)
	}
	// runs waits until node's newest have reports web at build.
	runs := func(node, build string, limit time.Duration) {
		t.Helper()
		waitfor.Until(t, limit, node+" running web "+build, func() bool {
			h, err := store.LastMsg(ctx, stream, subj, node, events.KindHave)
			if err != nil {
				return false
			}
			have, ok := h.Event.Payload.(*events.Have)
			return ok && len(have.Modules) == 1 && have.Modules[0].Build == build && have.Modules[0].State == events.Running
		})
	}
	nodes := []string{"ace", "bob", "cat"}
	procs := map[string]*meshfoldProcess{}
	pub := store.NewPublisher(m.js, subj)
	for _, n := range nodes {
		procs[n] = agent(n)
		if _, err := pub.Append(ctx, n, events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		runs(n, "web:1", 30*time.Second)
	}
	file := filepath.Join(dir, "fleet.yaml")
	yaml := "fleet: web\nnodes: {ace: {}, bob: {}, cat: {}}\ngroups: [{name: all, select: {}, modules: [{name: web, build: \"web:2\"}]}]\n" +
		"rollout: {batch: 1, max_unavailable: 1, min_healthy: 1s, healthy_deadline: 20s}\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errs, code := m.cli(t, "apply", "-f", file, "--by", "alice")
	if code != 0 {
		t.Fatalf("apply: code %d\n%s%s", code, out, errs)
	}
	// During the rollout, before its batch: cat's agent killed.
	killed := time.Now()
	if err := procs["cat"].cmd.Process.Signal(syscall.SIGKILL); err != nil { // by pid: the process this test started
		t.Fatal(err)
	}
	procs["cat"].wait(t, ctx)

	v := waitStatus(t, m, func(v rollout.View) bool { return v.Phase.Final() })
	took := time.Since(killed)
	if v.Phase != rollout.Completed || v.Counts[rollout.Done] != 2 || v.Counts[rollout.Unreached] != 1 {
		t.Fatalf("phase %s, counts %v, want completed with 2 done and 1 unreached", v.Phase, v.Counts)
	}
	for _, tv := range v.Targets {
		if tv.Node == "cat" && (tv.Status != rollout.Unreached || tv.Published == 0 || !tv.Down) {
			t.Errorf("cat: %+v, want unreached, its want published, its agent down", tv)
		}
	}
	runs("ace", "web:2", 10*time.Second)
	runs("bob", "web:2", 10*time.Second)

	runs("cat", "web:1", time.Second) // its last have, from before the kill
	procs["cat"] = agent("cat")
	restarted := time.Now()
	runs("cat", "web:2", 30*time.Second)
	t.Logf("cat killed -9 during the rollout: completed with cat unreached %s later; restarted, cat ran its newest want (web:2) after %s",
		took.Round(100*time.Millisecond), time.Since(restarted).Round(time.Millisecond))
	for _, n := range nodes {
		ids := 0
		err := store.ReadNode(ctx, m.js, m.cfg.Name, subj, n, v.Rollout, 0, func(msg store.Msg) error {
			if msg.Event.Kind == events.KindWant {
				ids++
				if msg.MsgID != rollout.WantID("web", v.Rollout, n, rollout.StepForward) {
					t.Errorf("%s: want #%d has id %q", n, msg.Event.Seq, msg.MsgID)
				}
			}
			return nil
		})
		if err != nil || ids != 1 {
			t.Errorf("%s: %d wants since the start (%v), want 1", n, ids, err)
		}
	}
}
