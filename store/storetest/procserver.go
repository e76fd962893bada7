package storetest

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/internal/testproc"
)

// ProcServer is one standalone nats-server process with JetStream on
// loopback (a random client port and monitoring port), its store in
// t.TempDir(): the separate server a benchmark measures a reconciler
// process against, whose CPU time it reads from /proc by [ProcServer.Pid].
// Cleanup kills it (SIGKILL to its process group) if still running.
type ProcServer struct {
	t       testing.TB
	cmd     *exec.Cmd
	url     string
	monitor int
	prof    int // the server's pprof port (prof_port)
	log     string
	bin     string
	conf    string
}

// StartProcServer builds nats-server as [StartProcCluster] does (once;
// cached across runs) and starts one server process in its own process
// group, killed when the test process dies (testproc.StartChild). It
// returns once /healthz answers 200 (up to 30 s). The test is skipped
// when the go tool is not available to build the server.
func StartProcServer(t testing.TB) *ProcServer {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("storetest: no go tool to build nats-server")
	}
	bin, err := natsServerBinary()
	if err != nil {
		t.Fatal(err)
	}
	ports := freePorts(t, 3)
	dir := t.TempDir()
	conf := filepath.Join(dir, "server.conf")
	s := &ProcServer{t: t, url: fmt.Sprintf("nats://127.0.0.1:%d", ports[0]), monitor: ports[1], prof: ports[2],
		log: filepath.Join(dir, "server.log"), bin: bin, conf: conf}
	if err := os.WriteFile(conf, fmt.Appendf(nil, "server_name: solo\nlisten: 127.0.0.1:%d\nhttp: 127.0.0.1:%d\nprof_port: %d\njetstream: { store_dir: %q }\n",
		ports[0], ports[1], ports[2], filepath.Join(dir, "js")), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	s.start()
	return s
}

// start starts the server process on its configuration (appending to
// its log) and waits until /healthz answers 200 (up to 30 s).
func (s *ProcServer) start() {
	t := s.t
	t.Helper()
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	s.cmd = exec.Command(s.bin, "-c", s.conf)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := testproc.StartChild(s.cmd); err != nil {
		t.Fatalf("storetest: start nats-server: %v", err)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz", s.monitor)
	hc := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("storetest: nats-server not healthy after 30s (last: %v); log %s", err, s.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Restart starts the server again, after [ProcServer.Stop] (a kill -9),
// on the same port and store directory, and returns once it is healthy
// (up to 30 s). What it held in memory (ephemeral consumers) is gone, as
// after any server restart; what it stored on disk is recovered.
func (s *ProcServer) Restart() {
	s.t.Helper()
	if s.cmd != nil && s.cmd.ProcessState == nil {
		s.t.Fatal("storetest: restart of a server that runs")
	}
	s.start()
}

// URL is the server's client URL, nats://127.0.0.1:PORT.
func (s *ProcServer) URL() string { return s.url }

// CPUProfile returns a CPU profile of the server over the next d, from
// its pprof listener (prof_port, on the loopback address it listens on).
func (s *ProcServer) CPUProfile(d time.Duration) ([]byte, error) {
	return s.pprof(fmt.Sprintf("profile?seconds=%d", int(d.Seconds())), d)
}

// HeapProfile returns the server's heap profile (its pprof listener).
func (s *ProcServer) HeapProfile() ([]byte, error) { return s.pprof("heap", 0) }

func (s *ProcServer) pprof(what string, d time.Duration) ([]byte, error) {
	return pprofGet(s.prof, what, d)
}

// pprofGet fetches /debug/pprof/what from a server's pprof listener on
// loopback port port, allowing d for the profile and 30 s more.
func pprofGet(port int, what string, d time.Duration) ([]byte, error) {
	hc := &http.Client{Timeout: d + 30*time.Second}
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/%s", port, what))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("server profile %s: %s", what, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// Pid is the server process's pid (also its process group's id).
func (s *ProcServer) Pid() int { return s.cmd.Process.Pid }

// CPU is the server process's CPU time so far, user and system (see
// [ProcCPU]).
func (s *ProcServer) CPU() time.Duration {
	s.t.Helper()
	d, err := ProcCPU(s.Pid())
	if err != nil {
		s.t.Fatal(err)
	}
	return d
}

// Connect opens a connection to the server and a JetStream context; opts
// come after a default that reconnects forever every 50 ms. Cleanup
// closes it.
func (s *ProcServer) Connect(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	all := append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)
	nc, err := nats.Connect(s.url, all...)
	if err != nil {
		t.Fatalf("storetest: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("storetest: jetstream: %v", err)
	}
	return nc, js
}

// clockTicks is the unit of /proc/<pid>/stat's CPU times: USER_HZ, 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// ProcCPU returns the CPU time, user and system, that process pid has
// used so far (its threads', not its children's), from /proc/<pid>/stat
// fields 14 and 15, at the 10 ms resolution of USER_HZ. Linux only; an
// error when the process is gone (or reaped) or the file cannot be read.
func ProcCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("storetest: cpu of %d: %w", pid, err)
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// the fields after its closing parenthesis start at field 3.
	i := strings.LastIndexByte(string(data), ')')
	f := strings.Fields(string(data[i+1:]))
	if i < 0 || len(f) < 13 {
		return 0, fmt.Errorf("storetest: cpu of %d: malformed stat %q", pid, data)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("storetest: cpu of %d: malformed stat %q", pid, data)
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// Stop kills the server (SIGKILL to its process group) and reaps it;
// Cleanup does nothing more. Its store directory stays until Cleanup.
func (s *ProcServer) Stop() {
	if s.cmd.ProcessState != nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	_ = s.cmd.Wait()
}
