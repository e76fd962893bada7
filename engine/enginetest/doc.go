// Package enginetest is the test support of the reconciler's benchmarks
// (issue 17): a simulated fleet history written exactly as the reconciler
// would write it ([Simulate], [SimulateDense], [SimulateDown]; folded through
// reconcile/reconciletest, the one simulator of the fold), its loading onto a fresh
// stream ([History.Load]), the raw JetStream baselines the figures are
// ratios against ([RawConsume], [RawDecode], [RawDecodeStd], and
// [RawPipeline], a read that publishes effects; [RawLive], a publish and
// read that also publishes and reads back effects) and the end of a catch-up as
// the snapshot bucket shows it ([InputTargets], [WaitCheckpoints]).
//
// It reaches JetStream through package store's configuration and the
// jetstream client only and does not import package engine, so that the
// engine's own tests and the outside benchmarks of cmd/meshfold share one
// history. It is a library for tests and benchmarks, not a test itself.
package enginetest
