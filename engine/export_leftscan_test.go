package engine

// SetLeftScanMax sets how far behind the stream's last message at a
// session's start a recovery still asks for its partition's next message
// rather than its last (leftToRead), until restore is called. Not
// concurrently with a running reconciler.
func SetLeftScanMax(n uint64) (restore func()) {
	old := leftScanMax
	leftScanMax = n
	return func() { leftScanMax = old }
}
