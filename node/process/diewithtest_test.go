package process

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/testproc"
	"github.com/meshfold/meshfold/node/bundle"
)

// helperEnv marks this test binary re-executed as a test process that
// runs a module and waits: TestHelperRunsModule then runs instead of
// being skipped.
const helperEnv = "MESHFOLD_PROCESS_TEST_HELPER"

// TestHelperRunsModule is not a test: re-executed by
// TestShimsDieWithTheTest, it runs a module as the other tests do (a shim
// in its own session, the module in its own group), prints both pids and
// its temporary directory (killed, it never removes it: the test does)
// and waits until its stdin closes.
func TestHelperRunsModule(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("a helper process of TestShimsDieWithTheTest")
	}
	e := newEnv(t, Backoff{})
	e.script("sha256:a", sleeper, bundle.Manifest{})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	st := status(t, r, "web")
	fmt.Printf("shim %d module %d dir %s\n", st.ShimPID, st.PID, filepath.Dir(t.TempDir()))
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// A test binary killed from outside (SIGKILL, as a CI timeout does) takes
// the shims it started, and their modules, with it: a helper test process
// runs a module, is killed, and its shim and module are gone within
// seconds. Before, a shim (in a session of its own, as in production,
// where it outlives its agent) ran on, and its module with it.
func TestShimsDieWithTheTest(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRunsModule$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := testproc.StartChild(cmd); err != nil {
		t.Fatal(err)
	}
	helper := cmd.Process.Pid
	killed := false
	defer func() {
		if !killed {
			_ = syscall.Kill(helper, syscall.SIGKILL)
			_ = cmd.Wait()
		}
	}()
	type pids struct {
		shim, module int
		dir          string
	}
	got := make(chan pids, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var p pids
			if _, err := fmt.Sscanf(sc.Text(), "shim %d module %d dir %s", &p.shim, &p.module, &p.dir); err == nil {
				got <- p
			}
		}
		close(got)
	}()
	var p pids
	select {
	case v, ok := <-got:
		if !ok {
			t.Fatal("the helper exited without running a module")
		}
		p = v
		testproc.RemoveChildTempDir(t, p.dir, "TestHelperRunsModule")
	case <-time.After(deadline):
		t.Fatalf("the helper ran no module within %s", deadline)
	}
	if err := syscall.Kill(helper, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed = true
	for _, c := range []struct {
		what string
		pid  int
	}{{"shim", p.shim}, {"module", p.module}} {
		if err := testproc.WaitGone(c.pid, deadline); err != nil {
			// By the pids the helper printed: processes this test started.
			_ = syscall.Kill(-p.module, syscall.SIGKILL)
			_ = syscall.Kill(p.shim, syscall.SIGKILL)
			t.Fatalf("%s %d of the killed test process: %v", c.what, c.pid, err)
		}
	}
}
