// Package puretest is the one purity check of meshfold's pure cores
// (DESIGN.md §5.6), shared by the TestPure of reconcile, reconcile/audit,
// rollout and rollout/fleetfile: a package imports no NATS (directly or
// through any dependency) and nothing of meshfold but events and its own
// core, reads no clock, does no I/O and starts no goroutine.
package puretest
