package engine

// SetPrepareWindow sets cfg's reconciler's prepareWindow (n > 0): its
// own, not the package's, so the test runs beside others.
func SetPrepareWindow(cfg *ReconcilerConfig, n int) { cfg.tuning.prepareWindow = n }

// SetPublishPending sets how many of cfg's reconciler's effects may
// await their answers at once (n > 0), shared by its sessions
// (store.WithMaxPending): its own, not the package's.
func SetPublishPending(cfg *ReconcilerConfig, n int) { cfg.tuning.publishPending = n }
