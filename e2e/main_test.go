package e2e

import (
	"os"
	"syscall"
	"testing"

	"github.com/meshfold/meshfold/internal/testproc"
	"github.com/meshfold/meshfold/node/process/shim"
)

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
