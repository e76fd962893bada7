package rollout_test

import (
	"testing"

	"github.com/meshfold/meshfold/internal/puretest"
)

// TestPure is DESIGN.md §5.6 for the rollout core, as reconcile's
// TestPure: the package and its fleet file parser import no NATS
// (directly or through any dependency) and nothing of meshfold but events
// and rollout, read no clock, do no I/O and start no goroutine. Time
// arrives inside events.
func TestPure(t *testing.T) {
	for _, dir := range []string{".", "./fleetfile"} {
		t.Run(dir, func(t *testing.T) { puretest.Check(t, dir, "rollout") })
	}
}
