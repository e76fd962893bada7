package reconcile_test

import (
	"testing"

	"github.com/meshfold/meshfold/internal/puretest"
)

// TestPure is DESIGN.md §5.6: the core imports no NATS (directly or
// through any dependency), reads no clock, does no I/O and starts no
// goroutine. Time arrives inside events. Its test support,
// reconcile/reconciletest, is held to the same rule.
func TestPure(t *testing.T) {
	for _, dir := range []string{".", "./reconciletest"} {
		t.Run(dir, func(t *testing.T) { puretest.Check(t, dir, "reconcile") })
	}
}
