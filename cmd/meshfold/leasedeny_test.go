package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/store/storetest"
)

// `meshfold reconcile` whose user loses its lease bucket while it runs
// (the server's config reloaded with publishes to $KV.MESH_LEASES.>
// denied, as an operator's edit and `nats-server --signal reload` do)
// exits 1 at its next renewal, the denial explained: it ran on for ever,
// logging "NATS unreachable" while its stream lease expired under it.
func TestReconcileExitsWhenItsLeaseBucketIsDenied(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dir := t.TempDir()
	ps := storetest.StartPermServer(t, map[string]storetest.Publish{"reconciler": {}})
	out := newNoteBuffer()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan int, 1)
	go func() {
		done <- run(rctx, []string{"reconcile", "--server", ps.URL("reconciler"),
			"--signing-key", filepath.Join(dir, "reconciler-signing.nk"), "--log-level", "warn"}, nil, out, out)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	out.waitText(ctx, t, "reconcile", "meshfold: reconciling stream")
	at := ps.Deny(t, "reconciler", "$KV.MESH_LEASES.>")
	select {
	case code := <-done:
		done <- code // for the cleanup
		t.Logf("reconcile exited %d %s after the reload:\n%s", code, time.Since(at).Round(time.Millisecond), out.String())
		const want = "permission denied: these credentials may not publish to $KV.MESH_LEASES.stream"
		const user = "the user given (in the server URL) is reconciler"
		if code != exitError || !strings.Contains(out.String(), want) || !strings.Contains(out.String(), user) ||
			strings.Contains(out.String(), "unreachable") || strings.Contains(out.String(), ":"+storetest.PermPassword+"@") {
			t.Errorf("reconcile exited %d; want %d, %q and %q, no outage said, no password:\n%s", code, exitError, want, user, out.String())
		}
	case <-time.After(40 * time.Second):
		t.Fatalf("reconcile still runs 40 s after its user lost the lease bucket:\n%s", out.String())
	}
}
