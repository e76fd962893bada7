package engine

// SetPrepareWindow sets cfg's reconciler's prepareWindow (n > 0): its
// own, not the package's, so the test runs beside others.
func SetPrepareWindow(cfg *ReconcilerConfig, n int) { cfg.tuning.prepareWindow = n }
