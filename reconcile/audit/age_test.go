package audit_test

import (
	"testing"
	"time"

	"github.com/meshfold/meshfold/reconcile/audit"
)

// TestAgeOfATimeJustAhead checks that a time less than a second ahead
// of the reader's clock (a snapshot stamped by a reconciler whose clock
// runs a little ahead) reads "0s", as a sub-second age does, not "-0s";
// a skew of a second or more keeps its sign, and positive ages read as
// before.
func TestAgeOfATimeJustAhead(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{-time.Nanosecond, "0s"},
		{-400 * time.Millisecond, "0s"},
		{-999 * time.Millisecond, "0s"},
		{400 * time.Millisecond, "0s"},
		{-time.Second, "-1s"},
		{-5 * time.Second, "-5s"},
		{-3 * time.Minute, "-3m"},
		{45 * time.Second, "45s"},
		{12 * time.Minute, "12m"},
		{3*time.Hour + 10*time.Minute, "3h10m"},
		{52 * time.Hour, "2d4h"},
	} {
		if got := audit.Age(c.d); got != c.want {
			t.Errorf("Age(%v) = %q, want %q", c.d, got, c.want)
		}
	}
}
