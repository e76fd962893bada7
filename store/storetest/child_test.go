package storetest_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/internal/testproc"
	"github.com/meshfold/meshfold/store/storetest"
)

// childHelperEnv marks this test binary re-executed as a test process
// that starts a server process and waits: TestHelperStartsServer then
// runs instead of being skipped.
const childHelperEnv = "MESHFOLD_STORETEST_CHILD_HELPER"

// TestHelperStartsServer is not a test: re-executed by
// TestChildrenDieWithTheTest, it starts a nats-server process as a test
// does, prints its pid and its temporary directory (killed, it never
// removes it: the test does) and waits until its stdin closes.
func TestHelperStartsServer(t *testing.T) {
	if os.Getenv(childHelperEnv) != "1" {
		t.Skip("a helper process of TestChildrenDieWithTheTest")
	}
	s := storetest.StartProcServer(t)
	fmt.Printf("pid %d dir %s\n", s.Pid(), filepath.Dir(t.TempDir()))
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// A test binary killed from outside (SIGKILL, as a CI timeout does) takes
// the server processes it started with it: a helper test process starts
// one, is killed, and the server is gone within seconds. Before
// testproc.StartChild, such servers ran on for good.
func TestChildrenDieWithTheTest(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("a parent-death signal is Linux's")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperStartsServer$", "-test.count=1")
	cmd.Env = append(os.Environ(), childHelperEnv+"=1")
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
			_ = syscall.Kill(-helper, syscall.SIGKILL)
			_ = cmd.Wait()
		}
	}()
	type started struct {
		pid int
		dir string
	}
	pids := make(chan started, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var s started
			if _, err := fmt.Sscanf(sc.Text(), "pid %d dir %s", &s.pid, &s.dir); err == nil {
				pids <- s
			}
		}
		close(pids)
	}()
	var server int
	select {
	case s, ok := <-pids:
		if !ok {
			t.Fatal("the helper exited without starting a server")
		}
		server = s.pid
		testproc.RemoveChildTempDir(t, s.dir, "TestHelperStartsServer")
	case <-time.After(2 * time.Minute): // the first run builds nats-server
		t.Fatal("the helper started no server within 2 minutes")
	}
	// SIGKILL to the helper alone, not its group: what survives is what
	// the kernel does not end for us.
	if err := syscall.Kill(helper, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed = true
	if err := testproc.WaitGone(server, 10*time.Second); err != nil {
		_ = syscall.Kill(-server, syscall.SIGKILL) // by the pid it printed: the server this test started
		t.Fatalf("server %d of the killed test process: %v", server, err)
	}
}
