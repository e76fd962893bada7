package process

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/testproc"
	"github.com/meshfold/meshfold/node/bundle"
)

// An upgrade replaces the agent and its shim command (`meshfold shim` of
// the earlier build, meshfold-shim of the new): the new runtime adopts the
// shims the earlier one started and stops them as its own, and starts
// every new shim with its own command. The test binary stands for both
// shims; the new command carries a mark in its argv.
func TestUpgradeAdoptsShimsOfTheEarlierCommand(t *testing.T) {
	e := newEnv(t, Backoff{})
	e.script("sha256:a", sleeper, bundle.Manifest{})
	r1, err := Open(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r1.Apply(ctx(t), events.PlanModule{Name: "old", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	was := status(t, r1, "old")
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	const mark = "new-shim-command"
	e.cfg.Shim = append(e.cfg.Shim[:1:1], mark)
	r2 := e.open()
	if st := status(t, r2, "old"); st.State != events.Running || st.ShimPID != was.ShimPID || st.PID != was.PID {
		t.Fatalf("adopted: %+v, want shim %d running %d", st, was.ShimPID, was.PID)
	}
	if err := r2.Apply(ctx(t), events.PlanModule{Name: "fresh", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	if argv := cmdline(t, status(t, r2, "fresh").ShimPID); !strings.Contains(argv, mark) {
		t.Errorf("the new module's shim runs %q, want the new command (%s)", argv, mark)
	}
	if argv := cmdline(t, was.ShimPID); strings.Contains(argv, mark) {
		t.Errorf("the adopted shim runs %q", argv)
	}
	if err := r2.Remove(ctx(t), "old"); err != nil {
		t.Fatal(err)
	}
	if alive(was.ShimPID, was.ShimStart) || alive(was.PID, was.PIDStart) {
		t.Errorf("the earlier command's shim %d or its module %d outlived the removal", was.ShimPID, was.PID)
	}
}

func cmdline(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(string(b), "\x00", " ")
}

// fakeShimEnv makes the test binary a fake shim that starts no module and
// reports the protocol the file it names holds (1 when there is none), to
// test what the runtime does with a shim of another protocol.
const fakeShimEnv = "MESHFOLD_PROCESS_TEST_FAKE_SHIM"

func fakeShim(protocolFile, dir string) int {
	testproc.DieWithParent(syscall.SIGKILL)
	pid := os.Getpid()
	start, err := startTime(pid)
	if err != nil {
		return 2
	}
	if err := writeJSON(dir, shimFile, identity{PID: pid, Start: start, Boot: bootID()}); err != nil {
		return 2
	}
	l, err := listenUnix(dir, sockFile)
	if err != nil {
		return 2
	}
	st := func() Status {
		p := 1
		if b, err := os.ReadFile(protocolFile); err == nil {
			p, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		return Status{Module: filepath.Base(dir), State: events.Running, ShimPID: pid, ShimStart: start, Protocol: p}
	}
	ready := os.NewFile(3, "ready")
	_ = json.NewEncoder(ready).Encode(st())
	_ = ready.Close()
	for {
		c, err := l.Accept()
		if err != nil {
			return 0
		}
		go func() {
			defer c.Close()
			var req request
			if json.NewDecoder(c).Decode(&req) == nil {
				_ = json.NewEncoder(c).Encode(st())
				_, _ = io.Copy(io.Discard, c)
			}
		}()
	}
}

// The runtime drives no shim that speaks another protocol: one it starts
// fails the apply, one it finds at adoption is reported stopped; either is
// killed by its identity.
func TestShimOfAnotherProtocolIsNotDriven(t *testing.T) {
	e := newEnv(t, Backoff{})
	proto := filepath.Join(t.TempDir(), "protocol")
	e.cfg.ShimEnv = []string{fakeShimEnv + "=" + proto}
	e.script("sha256:a", sleeper, bundle.Manifest{})
	dir := filepath.Join(e.cfg.StateDir, "process", "web")
	if err := os.WriteFile(proto, []byte("2"), 0o600); err != nil {
		t.Fatal(err)
	}
	r1, err := Open(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = r1.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: self})
	if !errors.Is(err, errShimProtocol) || !strings.Contains(err.Error(), "protocol 2, this agent 1") {
		t.Fatalf("apply with a shim of protocol 2: %v", err)
	}
	var id identity
	if err := readShimID(dir, &id); err != nil {
		t.Fatal(err)
	}
	if alive(id.PID, id.Start) {
		t.Errorf("the shim of protocol 2 (pid %d) was not killed", id.PID)
	}

	// One of protocol 1 runs; the next agent finds it speaking 2.
	if err := os.WriteFile(proto, []byte("1"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r1.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	st := status(t, r1, "web")
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(proto, []byte("2"), 0o600); err != nil {
		t.Fatal(err)
	}
	r2 := e.open()
	if got := status(t, r2, "web"); got.State != events.Stopped {
		t.Errorf("module of a shim of protocol 2 at adoption: %+v, want stopped", got)
	}
	if alive(st.ShimPID, st.ShimStart) {
		t.Errorf("the adopted shim of protocol 2 (pid %d) was not killed", st.ShimPID)
	}
}

func readShimID(dir string, id *identity) error {
	b, err := os.ReadFile(filepath.Join(dir, shimFile))
	if err != nil {
		return err
	}
	return json.Unmarshal(b, id)
}
