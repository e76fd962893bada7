package main

import (
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
