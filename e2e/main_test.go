package e2e

import (
	"os"
	"testing"

	"github.com/meshfold/meshfold/node/process"
)

// shimEnv marks this test binary re-executed as a process runtime shim
// (the per-module supervisor, DESIGN.md §8): TestMain then runs the shim
// instead of the tests, as `meshfold shim DIR` does in production.
const shimEnv = "MESHFOLD_E2E_SHIM"

func TestMain(m *testing.M) {
	if os.Getenv(shimEnv) == "1" {
		os.Exit(process.ShimMain(os.Args[len(os.Args)-1]))
	}
	os.Exit(m.Run())
}
