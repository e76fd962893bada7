package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/rollout/fleetfile"
)

// An apply whose read of the nodes ran out of --timeout says which step
// and which node, that nothing was published and what to do, not only
// the stored subject and "context deadline exceeded" (a fresh user's
// finding G0: `meshfold: last message on 0.mesh.n03.want: context
// deadline exceeded`, exit 1).
func TestApplySaysWhatTimedOut(t *testing.T) {
	t.Parallel()
	m := applyMesh(t)
	f, _, err := fleetfile.Parse([]byte(fleetYAML))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := m.js.Stream(testCtx(t), m.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	// The nodes' reads as apply makes them (after the fleet's newest
	// start), its --timeout spent.
	past, cancel := context.WithDeadline(testCtx(t), time.Now().Add(-time.Second))
	defer cancel()
	_, readErr := feed.CandidatesHeld(past, stream, m.cfg.Subjects(), f, nil)
	if readErr == nil {
		t.Fatal("a read past its deadline succeeded")
	}
	err = applyGaveUp(readErr, "reading the fleet's nodes' newest events", len(f.Nodes), 30*time.Second, 30*time.Second+40*time.Millisecond)
	msg := err.Error()
	var re *feed.ReadError
	if !errors.As(err, &re) {
		t.Fatalf("%v: not a read of a node", err)
	}
	for _, want := range []string{
		"apply gave up after 30s, its --timeout (30s)",
		"reading node " + re.Node + "'s newest want (one of the 3 nodes read before anything is published)",
		"nothing was published, so running it again is safe",
		"--timeout 1m0s",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not say %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, ".mesh.") {
		t.Errorf("the error names a stored subject:\n%s", msg)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%v does not wrap the deadline", err)
	}
	// A refusal is said as it is; another read error says its step.
	refused := withCode(exitConflict, errors.New("refused: nothing was published"))
	if got := applyGaveUp(refused, "reading the other fleets' rollouts", 3, time.Second, time.Second); got != refused {
		t.Errorf("a refusal became %v", got)
	}
	other := applyGaveUp(errors.New("stream info: no responders"), "reading the other fleets' rollouts", 3, time.Second, time.Second).Error()
	if other != "apply: reading the other fleets' rollouts: stream info: no responders; nothing was published" {
		t.Errorf("another error: %s", other)
	}
}
