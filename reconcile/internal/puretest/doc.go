// Package puretest is the one purity check of meshfold's pure core
// (DESIGN.md §5.6), shared by the TestPure of reconcile and of
// reconcile/audit: a package imports no NATS (directly or through any
// dependency) and nothing of meshfold but events and reconcile, reads no
// clock, does no I/O and starts no goroutine.
package puretest
