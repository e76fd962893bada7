package e2e

import (
	"os"
	"syscall"
	"testing"

	"github.com/meshfold/meshfold/internal/testproc"
	"github.com/meshfold/meshfold/node/process/shim"
)

// The tests of this package call t.Parallel: most of their time is spent
// waiting on servers, elections, leases and timers, not computing. A test
// stays serial, and says why on its first line ("Not parallel: ..."), when
// it sets the environment (t.Setenv) or a package-level hook, measures the
// process, or times something against a tight limit. The serial ones run
// first, alone; then the parallel ones, -parallel at a time.

// shimEnv marks this test binary re-executed as a process runtime shim
// (the per-module supervisor, DESIGN.md §8): TestMain then runs the shim
// instead of the tests, as `meshfold shim DIR` does in production.
const shimEnv = "MESHFOLD_E2E_SHIM"

func TestMain(m *testing.M) {
	if os.Getenv(shimEnv) == "1" {
		// A shim of a test ends with the test process (SIGTERM: it stops
		// its module first): a test binary killed from outside leaves
		// neither behind.
		testproc.DieWithParent(syscall.SIGTERM)
		os.Exit(shim.Main(os.Args[len(os.Args)-1]))
	}
	testproc.MarkParent()
	os.Exit(m.Run())
}
