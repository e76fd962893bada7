package engine

import "time"

// SetReadStallAfter sets cfg's reconciler's readStallAfter (d > 0): its
// own, not the package's, so the test runs beside others.
func SetReadStallAfter(cfg *ReconcilerConfig, d time.Duration) { cfg.tuning.readStallAfter = d }

// SetFollowRideOut sets cfg's reconciler's followRideOut (d > 0): its
// own, not the package's, so the test runs beside others.
func SetFollowRideOut(cfg *ReconcilerConfig, d time.Duration) { cfg.tuning.followRideOut = d }
