// Package testproc makes the processes a test starts die with the test,
// so that a test binary killed from outside (a CI timeout, SIGKILL)
// leaves none behind: [StartChild] for a child the test starts itself,
// [MarkParent] and [DieWithParent] for one that the code under test
// starts in a session of its own (the process runtime's shims), and
// [WaitGone] to see that a process is gone. The parent-death signal is
// Linux's; elsewhere only the process groups remain.
//
// It is a library for tests, not a test itself, and imports nothing of
// meshfold.
package testproc
