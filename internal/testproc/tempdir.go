package testproc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// RemoveChildTempDir removes, at the test's cleanup, the temporary
// directory root (filepath.Dir of a t.TempDir) of a test binary this test
// re-executed as a helper running the test named helper, and then killed:
// a killed test process never runs its own cleanup, so each run would
// leave one directory behind in os.TempDir(). The directory is the
// helper's own report (its stdout), so it is removed only when it is
// what a t.TempDir of that test makes: os.TempDir()/<helper><digits>.
// Call it once the helper's processes are gone or when they will be.
func RemoveChildTempDir(t testing.TB, root, helper string) {
	t.Helper()
	if root == "" {
		return
	}
	rest, ok := strings.CutPrefix(root, filepath.Join(os.TempDir(), helper))
	if !ok || rest == "" || strings.Trim(rest, "0123456789") != "" {
		t.Errorf("the helper's temporary directory %q is not a %s's t.TempDir in %s: left", root, helper, os.TempDir())
		return
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(root); err != nil {
			t.Errorf("remove the killed helper's temporary directory: %v", err)
		}
	})
}
