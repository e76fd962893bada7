//go:build !linux

package storetest

import "syscall"

// dieWithParent does nothing where the kernel has no parent-death signal:
// there a killed test binary leaves its children behind.
func dieWithParent(*syscall.SysProcAttr) {}
