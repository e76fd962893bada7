package engine

// SetPrepareWindow sets how many effects a recovery prepares ahead of its
// sends, until restore is called. Not concurrently with a running
// reconciler.
func SetPrepareWindow(n int) (restore func()) {
	old := prepareWindow
	prepareWindow = n
	return func() { prepareWindow = old }
}
