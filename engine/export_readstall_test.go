package engine

import "time"

// SetReadStallAfter sets how long a partition's read may deliver nothing
// before its session asks its consumer whether it stalled, until restore
// is called. Not concurrently with a running reconciler.
func SetReadStallAfter(d time.Duration) (restore func()) {
	old := readStallAfter
	readStallAfter = d
	return func() { readStallAfter = old }
}

// SetFollowRideOut sets how long a session starts attempts to create its
// read's consumer again, until restore is called. Not concurrently with a
// running reconciler.
func SetFollowRideOut(d time.Duration) (restore func()) {
	old := followRideOut
	followRideOut = d
	return func() { followRideOut = old }
}
