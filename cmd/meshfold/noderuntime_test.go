package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNodeRuntimeFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"node", "ace", "--root", t.TempDir(), "--runtime", "docker"}, `--runtime "docker": want process or record`},
		{[]string{"shim"}, "accepts 1 arg"},
		// A node named shim is a node: its flags are checked as node's.
		{[]string{"node", "shim", "--root", t.TempDir(), "--runtime", "docker"}, `--runtime "docker": want process or record`},
	} {
		var out, errb strings.Builder
		if code := run(testCtx(t), tc.args, nil, &out, &errb); code != exitUsage || !strings.Contains(errb.String(), tc.msg) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.args, code, errb.String(), tc.msg)
		}
	}
}

// A --state-dir inside --root is refused (exit 2) before either directory
// is made: nothing is left behind (a fresh user's finding L7: --root/st
// was created, with the runtime's directories in it).
func TestNodeStateDirInsideRootLeavesNothing(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	state := filepath.Join(root, "st")
	var out, errb strings.Builder
	code := run(testCtx(t), []string{"node", "zed", "--root", root, "--state-dir", state, "-s", "nats://127.0.0.1:1"}, nil, &out, &errb)
	if code != exitUsage || !strings.Contains(errb.String(), "is inside the root") {
		t.Fatalf("exit %d, %q; want 2, the state dir inside the root", code, errb.String())
	}
	if _, err := os.Stat(root); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refusal left %s behind (%v)", root, err)
	}
}
