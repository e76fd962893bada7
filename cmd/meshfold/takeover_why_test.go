package main

import (
	"context"
	"encoding/json"
	"fmt"
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
	"github.com/meshfold/meshfold/store"
)

// TestRolloutSaysWhoseTakeoverAPlanWaitsFor: two `meshfold reconcile
// --group` processes split the partitions; one is killed with SIGKILL,
// then a rollout gives every target its new want. Until the survivor
// takes the dead one's partitions over (its leases expire after the
// TTL), the targets of those partitions are changing with no plan:
// 'rollout status' and 'rollout why' say why, naming the partition,
// the dead reconciler and when its lease expires (a fresh user's finding
// M4: an empty WHY for ~15 s). Once the survivor plans them the line is
// gone and the rollout completes.
func TestRolloutSaysWhoseTakeoverAPlanWaitsFor(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs and kills reconcile processes: not in -short")
	}
	m := startMesh(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	key := filepath.Join(t.TempDir(), signingKeyFile)
	common := []string{"reconcile", "--server", m.e.ClientURL(), "--signing-key", key, "--group", "g", "--snapshot-interval", "100ms"}
	// The last "partitions owned" line says what it owns now.
	owns := func(p *meshfoldProcess, n int) bool {
		last := ""
		for _, l := range strings.Split(p.stderr.String(), "\n") {
			if strings.Contains(l, `msg="partitions owned"`) {
				last = l
			}
		}
		return strings.Contains(last, fmt.Sprintf(" count=%d ", n))
	}
	a := startMeshfold(t, append(common, "--instance", "a")...)
	waitfor.Until(t, time.Minute, "a to own every partition", func() bool { return owns(a, 16) })
	b := startMeshfold(t, append(common, "--instance", "b")...)
	waitfor.Until(t, time.Minute, "a and b to own 8 partitions each", func() bool { return owns(a, 8) && owns(b, 8) })

	actx, stopAnswer := context.WithCancel(ctx)
	answered := make(chan error, 1)
	go func() { answered <- rolloutstest.Answer(actx, m.js, m.cfg, 0, nil) }()
	defer func() {
		stopAnswer()
		if err := <-answered; err != nil {
			t.Errorf("stand-in: %v", err)
		}
	}()

	// Nodes of both halves (a folds partitions 0-7, b 8-15), each with a
	// want by hand.
	subj := m.cfg.Subjects()
	var nodes, high []string
	for i := 0; len(nodes) < 8; i++ {
		n := fmt.Sprintf("n%02d", i)
		nodes = append(nodes, n)
		if subj.Partition(n) >= 8 {
			high = append(high, n)
		}
	}
	if len(high) == 0 {
		t.Fatal("no node of b's partitions")
	}
	pub := store.NewPublisher(m.js, subj)
	for _, n := range nodes {
		if _, err := pub.Append(ctx, n, events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	stream := mustStream(t, m)
	for _, n := range nodes {
		waitfor.Until(t, time.Minute, "the plan of "+n, func() bool {
			_, err := store.LastMsg(ctx, stream, subj, n, events.KindPlan)
			return err == nil
		})
	}

	// b killed -9, then the rollout.
	if err := b.cmd.Process.Signal(syscall.SIGKILL); err != nil { // by pid: the process this test started
		t.Fatal(err)
	}
	<-b.done
	killed := time.Now()
	var y strings.Builder
	y.WriteString("fleet: web\nnodes:\n")
	for _, n := range nodes {
		fmt.Fprintf(&y, "  %s: {}\n", n)
	}
	y.WriteString("groups: [{name: all, select: {}, modules: [{name: web, build: \"web:2\"}]}]\nrollout: {batch: 8, max_unavailable: 8, min_healthy: 0s, healthy_deadline: 2m}\n")
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(file, []byte(y.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := m.cli(t, "apply", "-f", file, "--by", "alice"); code != 0 {
		t.Fatalf("apply: code %d\n%s%s", code, out, errs)
	}

	// While b's leases have not expired: its targets changing, no plan,
	// and the WHY says whose takeover the plan waits for.
	node := high[0]
	var seen rollout.TargetView
	waitfor.Until(t, 2*time.Minute, node+"'s WHY naming b's partition", func() bool {
		out, _, code := m.cli(t, "rollout", "status", "web", "-o", "json")
		var v rollout.View
		if code != 0 || json.Unmarshal([]byte(out), &v) != nil {
			return false
		}
		for _, tv := range v.Targets {
			if tv.Node == node {
				seen = tv
			}
		}
		if seen.Plan != 0 {
			t.Fatalf("%s planned (#%d) before its WHY said why not: %+v", node, seen.Plan, seen)
		}
		return seen.Status == rollout.Changing && strings.Contains(seen.Why, "no plan yet")
	})
	seenAt := time.Since(killed)
	want := fmt.Sprintf("no plan yet of its want #%d: partition %d's reconciler, reconciler b of group g, has not renewed its lease since ", seen.Published, subj.Partition(node))
	if !strings.Contains(seen.Why, want) || !strings.Contains(seen.Why, "another reconciler takes it over once the lease expires, at ") {
		t.Errorf("%s's WHY:\n%s\nwant it to contain %q and when the takeover comes", node, seen.Why, want)
	}
	out, _, code := m.cli(t, "rollout", "status", "web")
	if code != 0 || !strings.Contains(out, want) {
		t.Errorf("rollout status web (code %d) lacks %q:\n%s", code, want, out)
	}
	out, _, code = m.cli(t, "rollout", "why", "web", node)
	if code != 0 || !strings.Contains(out, "\n"+want) {
		t.Errorf("rollout why web %s (code %d) lacks %q:\n%s", node, code, want, out)
	}
	t.Logf("rollout why web %s, %s after the kill:\n%s", node, time.Since(killed).Round(100*time.Millisecond), out)
	// A target of a's partitions says nothing of the kind.
	if out, _, _ := m.cli(t, "rollout", "status", "web", "-o", "json"); strings.Count(out, "no plan yet") > len(high) {
		t.Errorf("more targets than b's %d say no plan yet:\n%s", len(high), out)
	}

	// The takeover: a plans them, and the line is gone.
	var v rollout.View
	waitfor.Until(t, 2*time.Minute, "the rollout to end once a took b's partitions over", func() bool {
		out, _, code := m.cli(t, "rollout", "status", "web", "-o", "json")
		v = rollout.View{}
		return code == 0 && json.Unmarshal([]byte(out), &v) == nil && v.Phase.Final()
	})
	if v.Phase != rollout.Completed {
		t.Fatalf("rollout %s, want completed: %+v", v.Phase, v.Counts)
	}
	for _, tv := range v.Targets {
		if strings.Contains(tv.Why, "no plan yet") {
			t.Errorf("%s still says no plan yet: %s", tv.Node, tv.Why)
		}
	}
	t.Logf("b killed -9: %s's WHY said why it had no plan %s later; the rollout completed %s after the kill", node,
		seenAt.Round(100*time.Millisecond), time.Since(killed).Round(100*time.Millisecond))
}
