package main

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/node/process"
)

func TestNodeRuntimeFlag(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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

// An agent started under another node's name on that node's --state-dir
// is refused (exit 2) before it connects, naming the owner, and touches
// nothing in it (a fresh user's finding U19: hal adopted bob's modules,
// then its empty want stopped them and deleted their bundles).
func TestNodeRefusesAnotherNodesStateDir(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	root, state := filepath.Join(base, "root"), filepath.Join(base, "bob-state")
	if err := os.MkdirAll(filepath.Join(state, "bundles", "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "node-name"), []byte("bob\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb strings.Builder
	code := run(testCtx(t), []string{"node", "hal", "--root", root, "--state-dir", state, "-s", "nats://127.0.0.1:1"}, nil, &out, &errb)
	want := "state dir " + state + " belongs to node bob: give this node its own --state-dir"
	if code != exitUsage || !strings.Contains(errb.String(), want) {
		t.Fatalf("node hal on bob's state dir: exit %d, %q; want 2 and %q", code, errb.String(), want)
	}
	ents, err := os.ReadDir(state)
	if err != nil || len(ents) != 2 {
		t.Errorf("bob's state dir after the refusal: %v, %v; want bundles and node-name only", ents, err)
	}
	if data, _ := os.ReadFile(filepath.Join(state, "node-name")); string(data) != "bob\n" {
		t.Errorf("the refusal rewrote the record: %q", data)
	}
}

// A relative --state-dir is taken from the working directory once, at the
// start: the process runtime's shims run in "/", and a relative one named
// bundle directories they never found (every module failed to start,
// "removed since the module was applied": a fresh user's finding). The
// refusal of another node's state directory names it absolute.
func TestNodeTakesARelativeStateDirAbsolute(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	state := filepath.Join(base, "bob-state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "node-name"), []byte("bob\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(wd, state)
	if err != nil {
		t.Fatal(err)
	}
	var out, errb strings.Builder
	code := run(testCtx(t), []string{"node", "hal", "--root", filepath.Join(base, "root"), "--state-dir", rel, "-s", "nats://127.0.0.1:1"}, nil, &out, &errb)
	want := "state dir " + state + " belongs to node bob"
	if code != exitUsage || !strings.Contains(errb.String(), want) {
		t.Fatalf("node hal --state-dir %s: exit %d, %q; want 2 and %q", rel, code, errb.String(), want)
	}
}

// An agent whose state directory holds no shim while modules of its node
// run under its root, started from another state directory (a wiped or
// moved one), is refused (exit 2) before it connects, naming the shim and
// its state directory (a fresh user's finding U33: every module started
// a second time, the old shims ran on unsupervised).
func TestNodeRefusesWhileModulesRunFromAnotherStateDir(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	root, state, old := filepath.Join(base, "root"), filepath.Join(base, "state"), filepath.Join(base, "state.old")
	modDir := filepath.Join(old, "process", "web")
	if err := os.MkdirAll(modDir, 0o700); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(modDir, "shim.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	// A stand-in shim: its last argument is the module's directory, its
	// stdout the shim's log, and its child has the module's environment.
	rootAbs, _ := filepath.Abs(root)
	sh := exec.Command("/bin/sh", "-c", `env MESHFOLD_NODE=zed MESHFOLD_ROOT="$1" MESHFOLD_MODULE=web sleep 60 & wait`, "sh", rootAbs, modDir)
	sh.Stdout = logf
	sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-sh.Process.Pid, syscall.SIGKILL)
		_ = sh.Process.Kill()
		_ = sh.Wait()
	})
	waitfor.Value(t, 10*time.Second, "the stand-in module to run", func() (string, bool) {
		n := len(process.Others("zed", rootAbs, state))
		return strconv.Itoa(n), n == 1
	})
	var out, errb strings.Builder
	code := run(testCtx(t), []string{"node", "zed", "--root", root, "--state-dir", state, "-s", "nats://127.0.0.1:1"}, nil, &out, &errb)
	want := "modules of node zed already run under root " + rootAbs + ", started from another state directory than " + state +
		": web (shim pid " + strconv.Itoa(sh.Process.Pid) + ", state dir " + old + ")"
	if code != exitUsage || !strings.Contains(errb.String(), want) {
		t.Fatalf("exit %d, %q; want 2 and %q", code, errb.String(), want)
	}
}

// An agent on a root held by another node's agent is refused (exit 2)
// before it connects, naming the holder (a fresh user's finding U35: two
// agents on one root overwrote each other's filled files, and retiring
// one deleted the other's credentials).
func TestNodeRefusesAnotherNodesRoot(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	root := filepath.Join(base, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	release, held, _, err := node.LockRoot(root, "p1")
	if err != nil || !held {
		t.Fatalf("p1's lock: %v %v", held, err)
	}
	defer release()
	var out, errb strings.Builder
	code := run(testCtx(t), []string{"node", "p2", "--root", root, "--state-dir", filepath.Join(base, "p2-state"), "-s", "nats://127.0.0.1:1"}, nil, &out, &errb)
	want := "root " + root + " is held by the agent of node p1 (" + filepath.Join(root, node.RootLockFile) + ", pid " + strconv.Itoa(os.Getpid()) + ")"
	if code != exitUsage || !strings.Contains(errb.String(), want) {
		t.Fatalf("exit %d, %q; want 2 and %q", code, errb.String(), want)
	}
	if _, err := os.Stat(filepath.Join(base, "p2-state")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refusal made p2's state dir (%v)", err)
	}
}
