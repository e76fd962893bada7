package shim

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/cgroups/v3/cgroup2"
	"golang.org/x/sys/unix"
)

// The v2 path as far as a host without v2 controllers can take it: a
// process is born in the module's cgroup (clone3 into it), listed, and the
// emptied cgroup removed. A hybrid host (this CI) mounts an empty unified
// hierarchy at /sys/fs/cgroup/unified; a v2 host at /sys/fs/cgroup.
func TestCgroupV2Placement(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroups need root")
	}
	var root string
	for _, p := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			root = p
			break
		}
	}
	if root == "" {
		t.Skip("no cgroup v2 hierarchy is mounted")
	}
	group := "/meshfold-test/" + CgroupName("v2", t.TempDir())
	m, err := cgroup2.NewManager(root, group, &cgroup2.Resources{})
	if err != nil {
		t.Skipf("no cgroup can be made in the v2 hierarchy at %s: %v", root, err)
	}
	t.Cleanup(func() { _ = os.Remove(filepath.Join(root, "meshfold-test")) })
	cg := &cgroupV2{m: m, dir: filepath.Join(root, group)}
	attr := &os.ProcAttr{Sys: &syscall.SysProcAttr{Setpgid: true}}
	p, err := cg.spawn(attr.Sys, func() (*os.Process, error) {
		return os.StartProcess("/bin/sleep", []string{"sleep", "3600"}, attr)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Kill(); _, _ = p.Wait() }()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(p.Pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(strings.Split(strings.TrimSpace(string(data)), "\n"), "0::"+group) {
		t.Errorf("the process's cgroups:\n%s\nwant 0::%s", data, group)
	}
	pids, err := cg.pids()
	if err != nil || !slices.Contains(pids, p.Pid) {
		t.Errorf("pids %v, %v: want %d", pids, err, p.Pid)
	}
	if _, gone := (tree{cg: cg}).stop(syscall.SIGTERM, 0); !gone {
		t.Fatal("the tree did not stop")
	}
	_, _ = p.Wait()
	if err := cg.remove(); err != nil {
		t.Errorf("remove: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, group)); !os.IsNotExist(err) {
		t.Errorf("the cgroup is still there: %v", err)
	}
}
