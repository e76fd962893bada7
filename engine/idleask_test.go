package engine

import (
	"testing"
	"time"
)

// TestIdleTicksToAsk: a recovery asks the leader whether its end is still
// to come after recoveryIdleAfter without a message: every idle tick at
// the default interval or a longer one, one tick in fifty at the bench's
// 20 ms (each ask matches every subject of the partition on the server,
// issue 27).
func TestIdleTicksToAsk(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		interval time.Duration
		want     int
	}{
		{DefaultSnapshotInterval, 1},
		{5 * time.Second, 1},
		{20 * time.Millisecond, 50},
		{300 * time.Millisecond, 3},
		{0, 1},
	} {
		if got := idleTicksToAsk(c.interval); got != c.want {
			t.Errorf("idleTicksToAsk(%s) = %d, want %d", c.interval, got, c.want)
		}
	}
}
