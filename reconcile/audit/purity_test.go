package audit_test

import (
	"testing"

	"github.com/meshfold/meshfold/internal/puretest"
)

// TestPure holds reconcile/audit to reconcile's rule (DESIGN.md §5.6):
// no NATS (directly or through a dependency), nothing of meshfold but
// events and reconcile, no clock, no I/O, no goroutine.
func TestPure(t *testing.T) { puretest.Check(t, ".", "reconcile") }
