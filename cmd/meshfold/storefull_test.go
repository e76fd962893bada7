package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// mountSmallFS mounts a tmpfs of size on a new directory under /tmp (the
// test is skipped where that needs a root it does not have) and unmounts
// it at the end, after the cleanups registered later (serve's stop).
func mountSmallFS(t *testing.T, size string) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "storefull-")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		os.Remove(dir)
		t.Skipf("a small filesystem cannot be mounted here (needs root on Linux): mount: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
			return
		}
		os.Remove(dir)
	})
	return dir
}

// fillFS writes a file beside the data directory until the filesystem
// has no room (another process filling it, as on a shared disk).
func fillFS(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			return // no space left
		}
	}
}

// storeFullRig is serve on a 32 MB tmpfs, stopped (and waited for) before
// the filesystem is unmounted.
type storeFullRig struct {
	dir, url string
	srv      *role
}

func startStoreFullRig(t *testing.T, ctx context.Context) *storeFullRig {
	t.Helper()
	dir := mountSmallFS(t, "32m")
	srv, url, _ := startServe(t, ctx, filepath.Join(dir, "data"))
	t.Cleanup(func() {
		srv.cancel()
		<-srv.done
	})
	return &storeFullRig{dir: dir, url: url, srv: srv}
}

// wantUntilUnanswered publishes wants of new nodes, after the filesystem
// was filled, until one fails (a file store's block takes a few writes
// before one fails), and returns the failure's stderr.
func (r *storeFullRig) wantUntilUnanswered(t *testing.T, ctx context.Context) string {
	t.Helper()
	want := writeWantFile(t, goodWant)
	for i := range 60 {
		var out, errb strings.Builder
		code := run(ctx, []string{"want", fmt.Sprintf("w%d", i), "--new", "-f", want, "-s", r.url, "--timeout", "4s"}, nil, &out, &errb)
		if code != exitOK {
			return errb.String()
		}
	}
	t.Fatal("60 wants stored on a full filesystem")
	return ""
}

// A want sent while another process has filled serve's filesystem is
// never answered by the server (a file store that failed a write keeps
// its error and answers no later one): it was told "the stream did not
// answer within 30s (a server too busy …)", not the documented "the
// server cannot store" (a fresh user's finding G1). Now the CLI asks
// serve, which watches its store, and says the cause, since when, and
// what to do.
func TestWantOnFullFilesystemNamesTheCause(t *testing.T) {
	ctx := testCtx(t)
	r := startStoreFullRig(t, ctx)
	want := writeWantFile(t, goodWant)
	var out, errb strings.Builder
	if code := run(ctx, []string{"want", "first", "--new", "-f", want, "-s", r.url}, nil, &out, &errb); code != exitOK {
		t.Fatalf("want before the fill: exit %d: %s", code, errb.String())
	}
	fillFS(t, r.dir)
	errs := r.wantUntilUnanswered(t, ctx)
	t.Logf("stderr: %s", errs)
	for _, s := range []string{"the server cannot store: its data directory is full", "serve's store has taken no write since",
		"the filesystem has no room", "free space under the server's data directory", `"Disk full"`} {
		if !strings.Contains(errs, s) {
			t.Errorf("the refused want's error does not say %q:\n%s", s, errs)
		}
	}
	if strings.Contains(errs, "too busy") {
		t.Errorf("the refused want's error still guesses a busy server:\n%s", errs)
	}
	_ = time.Second
}
