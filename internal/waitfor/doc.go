// Package waitfor waits, in a test, until a condition holds or a deadline
// passes, and then fails the test saying what it waited for and what it
// last saw.
//
// The shell's tests wait on other goroutines and other processes: a
// reconciler folding, a shim reporting, a module writing its log. They
// wait on a condition, never for a fixed time (a sleep is a race under
// load): [Until] polls a condition with backoff, [Value] polls for a value
// and returns it, and [UntilOn] also wakes on a change notification. Each
// fails the test with t.Fatalf, so each is called from the test's own
// goroutine; a goroutine the test starts reports through a channel
// instead, and may use [Poll], which returns an error.
//
// It is a library for tests and imports nothing of meshfold.
package waitfor
