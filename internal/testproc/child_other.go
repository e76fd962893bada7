//go:build !linux

package testproc

import (
	"errors"
	"syscall"
	"time"
)

// dieWithParent does nothing where the kernel has no parent-death signal:
// there a killed test binary leaves its children behind.
func dieWithParent(*syscall.SysProcAttr) {}

// DieWithParent does nothing where the kernel has no parent-death signal.
func DieWithParent(syscall.Signal) {}

// WaitGone is Linux's (a pidfd).
func WaitGone(pid int, d time.Duration) error {
	return errors.New("testproc: WaitGone needs Linux")
}
