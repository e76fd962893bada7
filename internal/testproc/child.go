package testproc

import (
	"os/exec"
	"syscall"
)

// StartChild starts cmd as a child that does not outlive the test: in its
// own process group (a test ends the whole tree with SIGKILL to -pid)
// and, on Linux, sent SIGKILL by the kernel when the test process dies
// (PR_SET_PDEATHSIG), so that a test binary killed from outside (a CI
// timeout) leaves no process behind.
// Any SysProcAttr cmd already has is kept, these two fields set on it.
//
// The kernel sends the signal when the OS thread that started the child
// ends, not the process; the Go runtime ends a thread only when a
// goroutine locked to it (runtime.LockOSThread) returns, so do not call
// it from such a goroutine.
//
// Errors: cmd.Start's.
func StartChild(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	dieWithParent(cmd.SysProcAttr)
	return cmd.Start()
}
