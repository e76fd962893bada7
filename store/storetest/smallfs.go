package storetest

import (
	"os"
	"os/exec"
	"testing"
)

// SmallFS mounts a tmpfs of size ("4m", "32m") on a new directory
// /tmp/<prefix>*, and returns it and a func that resizes it (a remount).
// It unmounts the filesystem at the test's end, after the cleanups
// registered later (a server's stop). It skips the test where mounting
// is not permitted (not root, not Linux, a container without the
// right): the tests of a full disk (store/embedded, cmd/meshfold).
func SmallFS(t testing.TB, prefix, size string) (string, func(size string)) {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", prefix)
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
	return dir, func(size string) {
		t.Helper()
		if out, err := exec.Command("mount", "-o", "remount,size="+size, dir).CombinedOutput(); err != nil {
			t.Fatalf("remount %s size=%s: %v: %s", dir, size, err, out)
		}
	}
}
