package audit_test

import (
	"testing"

	"github.com/meshfold/meshfold/reconcile/internal/puretest"
)

// TestPure holds reconcile/audit and its test-support package
// reconcile/audit/audittest to reconcile's rule (DESIGN.md §5.6):
// no NATS (directly or through a dependency), no clock, no I/O, no
// goroutine. reconcile's own TestPure checks only its root package.
func TestPure(t *testing.T) {
	for _, dir := range []string{".", "./audittest"} {
		t.Run(dir, func(t *testing.T) { puretest.Check(t, dir) })
	}
}
