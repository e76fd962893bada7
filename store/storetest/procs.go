package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/internal/testproc"
	"github.com/meshfold/meshfold/internal/waitfor"
)

// ProcCluster is n nats-server processes forming one JetStream cluster
// over loopback routes, each with its own name (p0, p1, …), store
// directory in t.TempDir(), client, route and monitoring ports. Unlike
// [Cluster], whose servers stop with Shutdown (which first hands each
// Raft group it leads to a follower, so a new leader is elected in
// ~0.1 s), a ProcCluster server is killed with SIGKILL by its pid: its
// peers learn nothing but a closed route and elect new leaders only when
// their election timers fire (4–9 s in nats-server 2.15), as after a
// real crash. Cleanup kills every server still running.
type ProcCluster struct {
	t    testing.TB
	bin  string
	srvs []*procServer
}

type procServer struct {
	name    string
	conf    string
	client  int
	monitor int
	prof    int // pprof listener (prof_port)
	log     string

	mu  sync.Mutex
	cmd *exec.Cmd
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// natsServerBinary builds the nats-server of this module's go.mod (the
// version the embedded servers run) once per test process, into a
// directory under os.TempDir() that later runs reuse.
func natsServerBinary() (string, error) {
	binOnce.Do(func() {
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/nats-io/nats-server/v2").Output()
		if err != nil {
			binErr = fmt.Errorf("storetest: nats-server version: %w", err)
			return
		}
		version := strings.TrimSpace(string(out))
		dir := filepath.Join(os.TempDir(), "meshfold-storetest")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "nats-server-"+version)
		if _, err := os.Stat(binPath); err == nil {
			return
		}
		tmp := fmt.Sprintf("%s.%d", binPath, os.Getpid())
		build := exec.Command("go", "build", "-o", tmp, "github.com/nats-io/nats-server/v2")
		if out, err := build.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("storetest: build nats-server: %v\n%s", err, out)
			return
		}
		binErr = os.Rename(tmp, binPath)
	})
	return binPath, binErr
}

// StartProcCluster builds nats-server (once per test binary; cached
// across runs) and starts an n-server cluster of processes, each in its
// own process group and killed when the test process dies
// (testproc.StartChild). It returns once every server reports itself
// healthy (/healthz: JetStream current with its meta leader). The test is
// skipped when the go tool is not available to build the server.
func StartProcCluster(t testing.TB, n int) *ProcCluster {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("storetest: no go tool to build nats-server")
	}
	bin, err := natsServerBinary()
	if err != nil {
		t.Fatal(err)
	}
	ports := freePorts(t, 4*n)
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[4*i+1]))
	}
	c := &ProcCluster{t: t, bin: bin}
	for i := range n {
		dir := t.TempDir()
		s := &procServer{name: fmt.Sprintf("p%d", i), client: ports[4*i], monitor: ports[4*i+2], prof: ports[4*i+3],
			conf: filepath.Join(dir, "server.conf"), log: filepath.Join(dir, "server.log")}
		conf := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
http: 127.0.0.1:%d
prof_port: %d
jetstream: { store_dir: %q }
cluster: {
  name: meshfold-proc-test
  listen: 127.0.0.1:%d
  routes: [%s]
}
`, s.name, s.client, s.monitor, s.prof, filepath.Join(dir, "js"), ports[4*i+1], strings.Join(routes, ", "))
		if err := os.WriteFile(s.conf, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		c.srvs = append(c.srvs, s)
	}
	t.Cleanup(func() {
		for i := range c.srvs {
			c.kill(i)
		}
	})
	for i := range c.srvs {
		if err := c.start(i); err != nil {
			t.Fatal(err)
		}
	}
	for i := range c.srvs {
		if err := c.WaitHealthy(i, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.waitMeta(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

// waitMeta waits until every server names the same JetStream meta leader
// and that leader sees every other server as a current peer (/jsz's
// meta_cluster). /healthz alone can answer 200 before then: a test's
// first R3 stream create right after it was once refused with "no
// suitable peers for placement", and once went unanswered for 30 s.
func (c *ProcCluster) waitMeta(timeout time.Duration) error {
	type meta struct {
		MetaCluster struct {
			Leader   string `json:"leader"`
			Replicas []struct {
				Current bool `json:"current"`
			} `json:"replicas"`
		} `json:"meta_cluster"`
	}
	hc := &http.Client{Timeout: time.Second}
	read := func(s *procServer) (meta, error) {
		var m meta
		resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/jsz", s.monitor))
		if err != nil {
			return m, err
		}
		defer resp.Body.Close()
		return m, json.NewDecoder(resp.Body).Decode(&m)
	}
	ready := func() (string, bool) {
		leader := ""
		for _, s := range c.srvs {
			m, err := read(s)
			if err != nil {
				return err.Error(), false
			}
			l := m.MetaCluster.Leader
			if l == "" || (leader != "" && l != leader) {
				return fmt.Sprintf("%s names meta leader %q", s.name, l), false
			}
			leader = l
			if l != s.name {
				continue
			}
			current := 0
			for _, r := range m.MetaCluster.Replicas {
				if r.Current {
					current++
				}
			}
			if current < len(c.srvs)-1 {
				return fmt.Sprintf("meta leader %s sees %d of %d peers current", l, current, len(c.srvs)-1), false
			}
		}
		return "", true
	}
	deadline := time.Now().Add(timeout)
	for {
		last, ok := ready()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("storetest: the cluster's JetStream meta group not ready after %s (last: %s)", timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *ProcCluster) start(i int) error {
	s := c.srvs[i]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return fmt.Errorf("storetest: server %s already running", s.name)
	}
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(c.bin, "-c", s.conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := testproc.StartChild(cmd); err != nil {
		return fmt.Errorf("storetest: start %s: %w", s.name, err)
	}
	s.cmd = cmd
	return nil
}

// kill sends SIGKILL to server i's process group and reaps it; false if
// it was not running.
func (c *ProcCluster) kill(i int) bool {
	s := c.srvs[i]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return false
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	_ = s.cmd.Wait()
	s.cmd = nil
	return true
}

// N returns the number of servers.
func (c *ProcCluster) N() int { return len(c.srvs) }

// Name returns server i's name (p0, p1, …).
func (c *ProcCluster) Name(i int) string { return c.srvs[i].name }

// Index returns the index of the server named name, or -1.
func (c *ProcCluster) Index(name string) int {
	for i, s := range c.srvs {
		if s.name == name {
			return i
		}
	}
	return -1
}

// Kill kills server i with SIGKILL (by the pid of its process group) and
// waits for the process to end. It fails the test if i was not running.
func (c *ProcCluster) Kill(i int) {
	c.t.Helper()
	if !c.kill(i) {
		c.t.Fatalf("storetest: kill %s: not running", c.srvs[i].name)
	}
}

// Restart starts killed server i again on its configuration and store
// directory and waits until it is healthy (up to 60 s).
func (c *ProcCluster) Restart(i int) {
	c.t.Helper()
	if err := c.start(i); err != nil {
		c.t.Fatal(err)
	}
	if err := c.WaitHealthy(i, 60*time.Second); err != nil {
		c.t.Fatal(err)
	}
}

// Stop kills every server still running (SIGKILL to each process group,
// by its pid) and reaps it, as Cleanup does.
func (c *ProcCluster) Stop() {
	for i := range c.srvs {
		c.kill(i)
	}
}

// Pid returns server i's pid (also its process group's id), or 0 when it
// does not run.
func (c *ProcCluster) Pid(i int) int {
	s := c.srvs[i]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// CPU returns server i's CPU time so far, user and system ([ProcCPU]);
// it fails the test if server i does not run.
func (c *ProcCluster) CPU(i int) time.Duration {
	c.t.Helper()
	pid := c.Pid(i)
	if pid == 0 {
		c.t.Fatalf("storetest: CPU of %s: not running", c.srvs[i].name)
	}
	d, err := ProcCPU(pid)
	if err != nil {
		c.t.Fatal(err)
	}
	return d
}

// CPUProfile returns a CPU profile of server i over the next d, from its
// pprof listener (prof_port, on loopback).
func (c *ProcCluster) CPUProfile(i int, d time.Duration) ([]byte, error) {
	return pprofGet(c.srvs[i].prof, fmt.Sprintf("profile?seconds=%d", int(d.Seconds())), d)
}

// Running reports whether server i runs.
func (c *ProcCluster) Running(i int) bool {
	s := c.srvs[i]
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// WaitHealthy waits until server i's /healthz answers 200: it accepts
// clients and its JetStream is current with the meta leader and with the
// streams and consumers it holds.
func (c *ProcCluster) WaitHealthy(i int, timeout time.Duration) error {
	s := c.srvs[i]
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz", s.monitor)
	deadline := time.Now().Add(timeout)
	hc := &http.Client{Timeout: time.Second}
	for {
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("storetest: server %s not healthy after %s (last: %v); log %s", s.name, timeout, err, s.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URLs returns every server's client URL, comma separated.
func (c *ProcCluster) URLs() string {
	var out []string
	for _, s := range c.srvs {
		out = append(out, fmt.Sprintf("nats://127.0.0.1:%d", s.client))
	}
	return strings.Join(out, ",")
}

// Connect opens a connection to the cluster (every server's URL, so it
// fails over), reconnecting forever every 50 ms, and a JetStream context.
// opts come after these defaults. Cleanup closes it.
func (c *ProcCluster) Connect(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	all := append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond),
		nats.ReconnectJitter(0, 0)}, opts...)
	nc, err := nats.Connect(c.URLs(), all...)
	if err != nil {
		t.Fatalf("storetest: connect to the cluster: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("storetest: jetstream: %v", err)
	}
	return nc, js
}

// Leader returns the index of the server leading stream's replica group
// (a KV bucket's stream is KV_<bucket>), as the stream's info says, or -1
// when none does or the info cannot be had.
func (c *ProcCluster) Leader(ctx context.Context, js jetstream.JetStream, stream string) int {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return -1
	}
	info := s.CachedInfo()
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return -1
	}
	return c.Index(info.Cluster.Leader)
}

// AwaitLeader returns the index of the server that leads stream once
// it has a leader, asking until limit; it fails t when none has been
// elected by then. A stream just created at R3 elects its first leader
// within a second here, several under load: one read of Leader right
// after EnsureStream found none in 2 of 6 race runs at load 16–22.
func (c *ProcCluster) AwaitLeader(t testing.TB, ctx context.Context, js jetstream.JetStream, stream string, limit time.Duration) int {
	t.Helper()
	return waitfor.Value(t, limit, "stream "+stream+" to have a leader", func() (int, bool) {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		i := c.Leader(lctx, js, stream)
		return i, i >= 0
	})
}

// MetaLeader returns the index of the server that leads the JetStream
// meta group as the first running server's /jsz says, or -1 when none
// does or no running server answers.
func (c *ProcCluster) MetaLeader() int {
	hc := &http.Client{Timeout: time.Second}
	for i, s := range c.srvs {
		if !c.Running(i) {
			continue
		}
		resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/jsz", s.monitor))
		if err != nil {
			continue
		}
		var m struct {
			MetaCluster struct {
				Leader string `json:"leader"`
			} `json:"meta_cluster"`
		}
		err = json.NewDecoder(resp.Body).Decode(&m)
		resp.Body.Close()
		if err != nil || m.MetaCluster.Leader == "" {
			continue
		}
		return c.Index(m.MetaCluster.Leader)
	}
	return -1
}

// MoveLeader asks the leader of stream's replica group (a KV bucket's
// stream is KV_<bucket>) to hand it to server i (a stepdown with server
// i preferred), and waits until stream's info names server i. Nothing is
// asked when server i leads it already.
func (c *ProcCluster) MoveLeader(ctx context.Context, js jetstream.JetStream, stream string, i int) error {
	req, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": c.srvs[i].name}})
	for {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		now := c.Leader(lctx, js, stream)
		cancel()
		if now == i {
			return nil
		}
		if now >= 0 {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			msg, err := js.Conn().RequestWithContext(rctx, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, req)
			cancel()
			if err == nil {
				var resp struct {
					Error *struct {
						Description string `json:"description"`
					} `json:"error"`
				}
				if json.Unmarshal(msg.Data, &resp) == nil && resp.Error != nil {
					c.t.Logf("storetest: %s's leader to %s: %s", stream, c.srvs[i].name, resp.Error.Description)
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("storetest: %s's leader is not %s after %w", stream, c.srvs[i].name, ctx.Err())
		case <-time.After(250 * time.Millisecond): // the pace of the asks, not a wait for an event
		}
	}
}

// ConnectVia is [ProcCluster.Connect] with server i's URL first and no
// randomizing: the connection is to server i while it runs (a test that
// kills another server keeps its client's connection).
func (c *ProcCluster) ConnectVia(t testing.TB, i int, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	urls := strings.Split(c.URLs(), ",")
	urls[0], urls[i] = urls[i], urls[0]
	all := append([]nats.Option{nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond),
		nats.ReconnectJitter(0, 0)}, opts...)
	nc, err := nats.Connect(strings.Join(urls, ","), all...)
	if err != nil {
		t.Fatalf("storetest: connect to %s: %v", c.srvs[i].name, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("storetest: jetstream: %v", err)
	}
	return nc, js
}

// MetaKill is a kill -9 of the server leading the cluster's meta group
// that a client connected elsewhere rides out: Other is the server the
// client is connected to ([ProcCluster.ConnectVia]) and the leader of
// the streams the test moves to it, so that only requests to the meta
// group (a consumer's or a bucket's creation) wait for an election.
type MetaKill struct {
	Meta, Other int
}

// PrepareMetaKill finds the meta leader (failing the test when there is
// none) and the server after it, which a test connects to and moves its
// streams' leaders to before [ProcCluster.KillMeta].
func (c *ProcCluster) PrepareMetaKill(t testing.TB) MetaKill {
	t.Helper()
	m := c.MetaLeader()
	if m < 0 {
		t.Fatal("storetest: no meta leader")
	}
	return MetaKill{Meta: m, Other: (m + 1) % c.N()}
}

// KillMeta kills k.Meta with SIGKILL and returns when it did; the test
// is skipped when the meta group's leader moved meanwhile (the kill would
// not be of its leader).
func (c *ProcCluster) KillMeta(t testing.TB, k MetaKill) time.Time {
	t.Helper()
	if now := c.MetaLeader(); now != k.Meta {
		t.Skipf("storetest: the meta leader moved from %s to %s meanwhile", c.Name(k.Meta), c.Name(now))
	}
	c.Kill(k.Meta)
	return time.Now()
}
