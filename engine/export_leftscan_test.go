package engine

// SetLeftScanMax sets cfg's reconciler's leftScanMax: its own, not the
// package's, so the test runs beside others.
func SetLeftScanMax(cfg *ReconcilerConfig, n uint64) {
	cfg.tuning.leftScanMax, cfg.tuning.leftScanSet = n, true
}
