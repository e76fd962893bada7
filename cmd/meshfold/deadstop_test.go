package main

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// deadStopLimit bounds the exit of a `meshfold reconcile` sent SIGTERM
// after its standalone nats-server was killed: half the election
// ride-out (20 s), which its final snapshot used to wait out with an
// attempt more, then its partitions' consumer deletions, the agents'
// watch and the stream lease's release (5 s each, unanswered): 30 s in
// all by hand, 0.1 s now.
const deadStopLimit = 10 * time.Second

// A user's way: `meshfold reconcile` against an external nats-server
// with one replica, a want folded and not yet in a snapshot, the server
// killed with SIGKILL, then SIGTERM: the process exits (status 0) within
// deadStopLimit, saying its final snapshot and its lease were left.
func TestReconcileStopsAgainstAKilledServer(t *testing.T) {
	// Not parallel: it times the stop (deadStopLimit).
	stopsAgainstAKilledServer(t, nil, deadStopLimit, "reconciler running", "stream lease not released")
}

// groupDeadStopLimit bounds the same exit of a --group member: it waited
// out its released leases' deletions and its member key's (2 s each,
// the lease bucket's operation timeout) and its watch's stop (5 s): 9.2 s
// by hand, 0.05 s now.
const groupDeadStopLimit = 5 * time.Second

// The same with --group, within groupDeadStopLimit: the member leaves its
// partitions' leases and its member key to expire (nothing can delete
// them), and says so.
func TestGroupReconcileStopsAgainstAKilledServer(t *testing.T) {
	// Not parallel: it times the stop (groupDeadStopLimit).
	stopsAgainstAKilledServer(t, []string{"--group", "g", "--instance", "i1"}, groupDeadStopLimit, "partitions owned",
		"partition leases not released: their server is gone", "member key not deleted: its server is gone",
		"leases left to expire after their TTL")
}

// stopsAgainstAKilledServer runs reconcile with args against a
// standalone nats-server, waits for ready in its log, kills the server
// and SIGTERMs it: it exits within limit, status 0, having said that its
// final snapshot was not written and each of said.
func stopsAgainstAKilledServer(t *testing.T, args []string, limit time.Duration, ready string, said ...string) {
	ps := storetest.StartProcServer(t)
	_, js := ps.Connect(t)
	dir := t.TempDir()
	proc := startMeshfold(t, append([]string{"reconcile", "--server", ps.URL(), "--signing-key", filepath.Join(dir, signingKeyFile),
		"--snapshot-interval", "1h", "--log-level", "info"}, args...)...)
	waitfor.Until(t, time.Minute, "the reconciler running", func() bool {
		return strings.Contains(proc.stderr.String(), ready)
	})
	stream, cfg, err := store.OpenStream(testCtx(t), js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	seq, err := store.NewPublisher(js, cfg.Subjects()).Append(testCtx(t), "ace",
		events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "img:1"}}}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, time.Minute, "ace's plan", func() bool {
		m, err := store.LastMsg(testCtx(t), stream, cfg.Subjects(), "ace", events.KindPlan)
		return err == nil && m.Event.Seq > seq.Seq
	})
	ps.Stop() // SIGKILL
	waitfor.Until(t, 10*time.Second, "the reconciler's disconnect", func() bool {
		return strings.Contains(proc.stderr.String(), "nats disconnected")
	})
	began := time.Now()
	if err := proc.cmd.Process.Signal(syscall.SIGTERM); err != nil { // by pid: the process this test started
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	if code := proc.wait(t, ctx); code != 0 {
		t.Fatalf("exit status %d; stderr:\n%s", code, proc.stderr.String())
	}
	t.Logf("exited %v after SIGTERM", time.Since(began).Round(time.Millisecond))
	for _, said := range append([]string{"the final snapshot of some partitions was not written"}, said...) {
		if !strings.Contains(proc.stderr.String(), said) {
			t.Errorf("stderr does not say %q:\n%s", said, proc.stderr.String())
		}
	}
}
