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
	ps := storetest.StartProcServer(t)
	_, js := ps.Connect(t)
	dir := t.TempDir()
	proc := startMeshfold(t, "reconcile", "--server", ps.URL(), "--signing-key", filepath.Join(dir, signingKeyFile),
		"--snapshot-interval", "1h", "--log-level", "info")
	waitfor.Until(t, time.Minute, "the reconciler running", func() bool {
		return strings.Contains(proc.stderr.String(), "reconciler running")
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
	ctx, cancel := context.WithTimeout(context.Background(), deadStopLimit)
	defer cancel()
	if code := proc.wait(t, ctx); code != 0 {
		t.Fatalf("exit status %d; stderr:\n%s", code, proc.stderr.String())
	}
	t.Logf("exited %v after SIGTERM", time.Since(began).Round(time.Millisecond))
	for _, said := range []string{"the final snapshot of some partitions was not written", "stream lease not released"} {
		if !strings.Contains(proc.stderr.String(), said) {
			t.Errorf("stderr does not say %q:\n%s", said, proc.stderr.String())
		}
	}
}
