package testproc

import (
	"os"
	"strconv"
)

// parentEnv holds the pid of the test process that children started by
// the code under test should die with.
const parentEnv = "MESHFOLD_TEST_PARENT"

// MarkParent records this process as the one that processes re-executed
// from the test binary die with ([DieWithParent]): call it in TestMain
// before m.Run, after the branch that runs such a child. Every process
// started later inherits the record in its environment; a helper process
// re-executed as a test records itself in its own TestMain.
func MarkParent() { _ = os.Setenv(parentEnv, strconv.Itoa(os.Getpid())) }
