package storetest

import "syscall"

// dieWithParent has the kernel send the child SIGKILL when its parent
// thread ends.
func dieWithParent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
