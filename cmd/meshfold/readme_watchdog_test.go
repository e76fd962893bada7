package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/internal/testproc"
	"github.com/meshfold/meshfold/internal/waitfor"
)

// readmeSessionEnv marks every process a README session starts: the
// session's shell exports it (its value is the session's directory), so
// serve, the node agents, their shims and whatever else the README's
// commands start inherit it, whatever group or session they put
// themselves in. A module does not (its shim gives it a minimal
// environment); its shim stops it.
const readmeSessionEnv = "MESHFOLD_README_SESSION"

// readmeWatchdogArg, as this test binary's first argument, makes it a
// README session's watchdog (TestMain runs readmeWatchdog).
const readmeWatchdogArg = "readme-watchdog"

// startReadmeWatchdog starts this test binary again as the watchdog of
// the session in dir: it waits until its stdin closes, which happens
// when this test process ends in any way (a CI timeout's kill included,
// when no cleanup runs), and then ends every process the session
// started (sweepReadmeSession). It runs in a process group of its own
// and without a parent-death signal, since it must outlive this
// process. At cleanup (after the session's stopAll) its stdin is
// closed and it is waited for, so a normal run sweeps too and leaves no
// watchdog behind.
func startReadmeWatchdog(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], readmeWatchdogArg, dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil || out.Len() > 0 {
				t.Logf("the session's watchdog: %v\n%s", err, out.String())
			}
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill() // by pid: the watchdog this test started
			<-done
			t.Errorf("the session's watchdog did not end within a minute:\n%s", out.String())
		}
	})
}

// readmeWatchdog is the watchdog's main: it waits for its stdin to close,
// then sweeps the session in dir and removes dir (a killed test's
// cleanup does not).
func readmeWatchdog(dir string) {
	// Its output goes to the test process, which may be gone: a write to
	// that broken pipe must fail, not end the watchdog (as SIGPIPE on
	// stdout or stderr does to a Go program that does not ask for it).
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	_, _ = io.Copy(io.Discard, os.Stdin)
	sweepReadmeSession(dir, func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) })
	_ = os.RemoveAll(dir)
}

// sweepReadmeSession ends every live process marked with the session in
// dir (readmeSessionEnv), by pid: first SIGKILL to all but the shims (so
// no agent restarts a module), then SIGTERM to the shims, which stop
// their module's whole tree, and SIGKILL to a shim still there after 15
// s; then again until none is marked, for 10 s at most.
func sweepReadmeSession(dir string, logf func(string, ...any)) {
	shims, others := readmeMarked(dir)
	for _, pid := range others {
		logf("killing pid %d of the session", pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, pid := range shims {
		logf("stopping shim %d of the session", pid)
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	for _, pid := range shims {
		if testproc.WaitGone(pid, 15*time.Second) != nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	end := time.Now().Add(10 * time.Second)
	for time.Now().Before(end) {
		shims, others = readmeMarked(dir)
		if len(shims)+len(others) == 0 {
			return
		}
		for _, pid := range append(shims, others...) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond) // until the kernel has reaped them, bounded
	}
	logf("processes of the session still there after 10 s: %v", append(shims, others...))
}

// readmeMarked returns the live processes whose environment holds the
// session's marker, the shims (`meshfold shim DIR`) apart.
func readmeMarked(dir string) (shims, others []int) {
	mark := []byte(readmeSessionEnv + "=" + dir)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || !processAlive(pid) {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !slices.ContainsFunc(bytes.Split(env, []byte{0}), func(v []byte) bool { return bytes.Equal(v, mark) }) {
			continue
		}
		argv, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if args := bytes.Split(argv, []byte{0}); len(args) > 1 && string(args[1]) == "shim" {
			shims = append(shims, pid)
		} else {
			others = append(others, pid)
		}
	}
	return shims, others
}

// readmeHelperEnv marks this test binary re-executed as a test process
// that runs a README session and waits: TestHelperReadmeSession then
// runs instead of being skipped.
const readmeHelperEnv = "MESHFOLD_README_HELPER"

// TestHelperReadmeSession is not a test: re-executed by
// TestReadmeSessionEndsWithTheTest, it starts a README session's shell
// and in it a background command that starts a process in the shell's
// group and one in a session of its own (as a node agent's shim is),
// prints their pids and waits until its stdin closes.
func TestHelperReadmeSession(t *testing.T) {
	if os.Getenv(readmeHelperEnv) != "1" {
		t.Skip("a helper process of TestReadmeSessionEndsWithTheTest")
	}
	s := newReadmeShell(t)
	s.start("two sleeps", "sleep 600 & echo $! > pids; setsid sleep 700 & echo $! >> pids; wait")
	pids := waitfor.Value(t, 30*time.Second, "the two pids in the session's pids file", func() ([]string, bool) {
		data, _ := os.ReadFile(filepath.Join(s.dir, "pids"))
		pids := strings.Fields(string(data))
		return pids, len(pids) == 2
	})
	fmt.Printf("pids %s %s\n", s.dir, strings.Join(pids, " "))
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// A test process killed from outside (SIGKILL, as a CI timeout does)
// while a README session runs leaves none of the session's processes
// behind, not even one in a session of its own: the helper test process
// is killed alone and each process its session started is gone within
// 30 s. Before the watchdog, TestReadmeCommands killed this way left
// serve, five node agents, the provisioner and six shims with their
// modules running.
func TestReadmeSessionEndsWithTheTest(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("the sweep reads /proc")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperReadmeSession$", "-test.count=1")
	cmd.Env = append(os.Environ(), readmeHelperEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := testproc.StartChild(cmd); err != nil {
		t.Fatal(err)
	}
	helper := cmd.Process.Pid
	killed := false
	defer func() {
		if !killed {
			_ = syscall.Kill(helper, syscall.SIGKILL) // the helper this test started
			_ = cmd.Wait()
		}
	}()
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "pids "); ok {
				lines <- rest
			}
		}
		close(lines)
	}()
	var pids []int
	var dir string
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatalf("the helper exited without starting its session:\n%s", stderr.String())
		}
		dir, l, _ = strings.Cut(l, " ")
		for _, f := range strings.Fields(l) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				t.Fatal(err)
			}
			pids = append(pids, pid)
		}
	case <-time.After(time.Minute):
		t.Fatalf("the helper started no session within a minute:\n%s", stderr.String())
	}
	if err := syscall.Kill(helper, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed = true
	for _, pid := range pids {
		if err := testproc.WaitGone(pid, 30*time.Second); err != nil {
			_ = syscall.Kill(pid, syscall.SIGKILL) // by the pid the helper printed: a process this test started
			t.Errorf("process %d of the killed test's README session: %v", pid, err)
		}
	}
	// And its directory: the watchdog removes it after the sweep, and no
	// process of the session writes into it afterwards.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := waitfor.Poll(ctx, "the session's directory gone", func() (bool, bool) {
		_, err := os.Stat(dir)
		return true, errors.Is(err, fs.ErrNotExist)
	}); err != nil {
		ents, _ := os.ReadDir(dir)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		_ = os.RemoveAll(dir) // the directory this test's helper made
		t.Errorf("the killed test's README session left %s behind, holding %v", dir, names)
	}
}
