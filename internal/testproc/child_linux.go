package testproc

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// dieWithParent has the kernel send the child SIGKILL when its parent
// thread ends.
func dieWithParent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }

// DieWithParent, called first in a process that a test's code started
// (a shim re-executed from the test binary), asks the kernel to send it
// sig when its parent ends. When the parent that [MarkParent] recorded
// has ended already (this process was reparented before the request
// took), it exits at once with status 1. Without a recorded parent it
// does nothing.
func DieWithParent(sig syscall.Signal) {
	want, err := strconv.Atoi(os.Getenv(parentEnv))
	if err != nil {
		return
	}
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(sig), 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "testproc: parent-death signal: %v\n", err)
		os.Exit(1)
	}
	if os.Getppid() != want {
		os.Exit(1)
	}
}

// WaitGone waits up to d for process pid (any process, not only a
// child) to end, through a pidfd that becomes readable when it exits; a
// zombie has ended, and a process already gone is no error.
//
// Errors: still running after d; the pidfd's.
func WaitGone(pid int, d time.Duration) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("testproc: pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(fd)
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("testproc: process %d still running after %s", pid, d)
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left.Milliseconds())+1)
		switch {
		case errors.Is(err, unix.EINTR):
		case err != nil:
			return fmt.Errorf("testproc: poll pidfd of %d: %w", pid, err)
		case n > 0:
			return nil
		}
	}
}
