package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nuid"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
)

// crashKills is how many times TestNoWarningsAfterKills kills the
// reconciler (issue 25 asks for 20).
const crashKills = 20

// TestNoWarningsAfterKills (issue 25, "warnings that clear"): the
// reconciler of serve (`meshfold reconcile`, engine.Serve in a process of
// its own: the NATS server must outlive it so that wants can be published
// while it is down) is killed with SIGKILL, by pid, crashKills times,
// each time at a random moment (right after wants were published, once
// their first plan is out, or once every node converged). While it is
// down, wants for every node are published, one node getting more than
// reconcile.MaxUnsettled of them; then it is started again. Real node
// agents (the record runtime) apply and settle the plans throughout.
//
// After each restart, once every node converged (its snapshot shows its
// newest want's plan settled, nothing unsettled), no node has a journal
// entry at warn or error: every node converged, so nothing needs an
// operator. At the end every effect is stored once and every snapshot
// equals a clean fold of the stream (chaosVerify).
func TestNoWarningsAfterKills(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills a reconciler process 20 times: not in -short")
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	m := startMesh(t)
	url := m.e.ClientURL()
	dir := t.TempDir()
	args := []string{"reconcile", "--server", url, "--signing-key", filepath.Join(dir, signingKeyFile),
		"--snapshot-interval", "100ms", "--log-level", "warn"}
	proc := startMeshfold(t, args...)
	kill := func() {
		t.Helper()
		if err := proc.cmd.Process.Signal(syscall.SIGKILL); err != nil { // by pid: the process this test started
			t.Fatal(err)
		}
		select {
		case <-proc.done:
		case <-ctx.Done():
			t.Fatalf("reconciler pid %d did not exit on SIGKILL", proc.cmd.Process.Pid)
		}
	}
	waitfor.Until(t, time.Minute, "the reconciler's trust file", func() bool {
		_, err := os.Stat(filepath.Join(dir, trustFileName))
		return err == nil
	})

	nodes := []string{"ace", "bob", "cid", "dan"}
	for _, n := range nodes {
		agent := startRole(ctx, "node", n, "--runtime", "record", "--root", filepath.Join(dir, n, "root"),
			"--state-dir", filepath.Join(dir, n, "state"), "--server", url, "--trust-from", dir)
		t.Cleanup(func() { agent.stop(t) })
	}

	pub := store.NewPublisher(m.js, m.cfg.Subjects())
	acked := map[uint64]string{}
	newest := map[string]uint64{} // node → its newest want's sequence
	build := 0
	want := func(node string) uint64 {
		t.Helper()
		build++
		w := &events.Want{Modules: []events.WantModule{{Name: "app", Build: fmt.Sprintf("a:%d", build), RunsAs: "app"}}}
		id := nuid.Next()
		ack, err := pub.Append(ctx, node, events.Stamp(w, time.Now()), store.WithMsgID(id))
		if err != nil {
			t.Fatalf("want %s: %v", node, err)
		}
		acked[ack.Seq] = id
		newest[node] = ack.Seq
		return ack.Seq
	}
	stream, err := m.js.Stream(ctx, m.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := store.OpenSnapshots(ctx, m.js, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	// converged reports whether node's snapshot shows its newest want's
	// plan settled and nothing unsettled: the reconciler folded the settle
	// and published (acknowledged) every effect up to it.
	converged := func(node string) bool {
		b, _, err := snaps.GetNode(ctx, node)
		if err != nil {
			return false
		}
		st, err := reconcile.UnmarshalState(b)
		return err == nil && st.Want != nil && st.Want.Seq == newest[node] &&
			st.Settled != nil && st.Settled.Want == newest[node] && len(st.Unsettled) == 0
	}
	allConverged := func(what string) {
		t.Helper()
		waitfor.Until(t, time.Minute, what, func() bool {
			for _, n := range nodes {
				if !converged(n) {
					return false
				}
			}
			return true
		})
	}
	// checkJournals fails the test for every journal entry at warn or
	// error of a node since the last check.
	read := map[string]uint64{} // node → the last sequence checked
	checkJournals := func(when string) {
		t.Helper()
		for _, n := range nodes {
			err := store.ReadNode(ctx, m.js, m.cfg.Name, m.cfg.Subjects(), n, read[n]+1, 0, func(msg store.Msg) error {
				read[n] = msg.Event.Seq
				if j, ok := msg.Event.Payload.(*events.Journal); ok && j.Level != events.LevelInfo {
					t.Errorf("%s: node %s converged, yet journaled at %s (#%d): %s", when, n, j.Level, msg.Event.Seq, j.Msg)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("read %s: %v", n, err)
			}
		}
	}
	planned := func(node string, cause uint64) bool {
		msg, err := store.LastMsg(ctx, stream, m.cfg.Subjects(), node, events.KindPlan)
		if err != nil { // store.ErrNoMessage: none yet
			return false
		}
		p, ok := msg.Event.Payload.(*events.Plan)
		return ok && p.Cause >= cause
	}

	for _, n := range nodes {
		want(n)
	}
	allConverged("every node's first want settled")
	checkJournals("before the first kill")

	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(25, seed))
	t.Logf("seed %d", seed)
	gapWants, downtime := 0, time.Duration(0)
	for round := range crashKills {
		// Live wants, then the kill at one of three moments.
		firstNode := nodes[rng.IntN(len(nodes))]
		first := want(firstNode)
		for range rng.IntN(3) {
			want(nodes[rng.IntN(len(nodes))])
		}
		switch rng.IntN(3) {
		case 0: // at once: their effects may be published and not checkpointed
		case 1:
			waitfor.Until(t, time.Minute, "the first live want's plan", func() bool { return planned(firstNode, first) })
		case 2:
			allConverged(fmt.Sprintf("round %d: every node converged before the kill", round))
		}
		kill()
		down := time.Now()
		// While no reconciler runs: wants for every node, one node
		// getting more than the unsettled cap holds.
		burst := nodes[round%len(nodes)]
		for _, n := range nodes {
			k := rng.IntN(3)
			if n == burst {
				k = reconcile.MaxUnsettled + 1 + rng.IntN(3)
			}
			for range k {
				want(n)
				gapWants++
			}
		}
		proc = startMeshfold(t, args...)
		allConverged(fmt.Sprintf("round %d: every node converged after the restart", round))
		downtime += time.Since(down)
		checkJournals(fmt.Sprintf("round %d", round))
	}
	chaosVerify(t, ctx, m.js, stream, m.cfg, acked)
	t.Logf("%d kills of the reconciler, %d wants published while it was down (%d nodes), %d wants in all; kill to every node converged: %s on average; the test took %s",
		crashKills, gapWants, len(nodes), len(acked), (downtime / crashKills).Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}
