package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/store/storetest"
)

// A client command run before serve is up says which server it tried and
// asks whether serve runs, with the flag and variable that name another
// (the connect helper, for every command).
func TestNoServerHint(t *testing.T) {
	url := "nats://127.0.0.1:" + freePort(t)
	t.Setenv("NATS_URL", "")
	t.Setenv("NATS_CONTEXT", "")
	for _, args := range [][]string{{"build", "ls"}, {"fleet"}} {
		var out bytes.Buffer
		var errb storetest.SyncBuffer
		code := run(testCtx(t), append(args, "--server", url), nil, &out, &errb)
		msg := errb.String()
		if code != exitError || !strings.Contains(msg, "no servers available") ||
			!strings.Contains(msg, "no server answered at "+url) ||
			!strings.Contains(msg, "is `meshfold serve` running?") || !strings.Contains(msg, "--server") ||
			!strings.Contains(msg, "$NATS_URL") {
			t.Errorf("%v: exit %d\n%s", args, code, msg)
		}
	}
}
