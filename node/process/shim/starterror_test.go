package shim

import (
	"errors"
	"io/fs"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A start whose working directory is missing says which directory and
// why, not the exec's "fork/exec /bin/sh: no such file or directory": an
// absolute one was removed; a relative one was never the agent's (the
// shim runs in "/": a relative --state-dir, a fresh user's finding).
func TestStartErrorNamesTheMissingDirectory(t *testing.T) {
	gone := filepath.Join(t.TempDir(), "bundles", "x")
	for _, c := range []struct {
		dir, says string
	}{
		{gone, "working directory " + gone + " does not exist (the module's bundle directory, removed since the module was applied)"},
		{"state/bundles/x", "working directory state/bundles/x is relative, and the shim runs in /: give the agent an absolute --state-dir"},
	} {
		cmd := exec.Command("/bin/sh", "-c", "true")
		cmd.Dir = c.dir
		err := startError(cmd.Start(), c.dir)
		if err == nil || !strings.Contains(err.Error(), c.says) || !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("dir %s: %v; want %q and fs.ErrNotExist", c.dir, err, c.says)
		}
	}
}
