package process

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/node/bundle"
	"github.com/meshfold/meshfold/node/process/shim"
)

// Config configures a [Runtime].
type Config struct {
	// Node is the node's name (MESHFOLD_NODE of every module).
	Node string
	// Root is where filled files are written (MESHFOLD_ROOT).
	Root string
	// StateDir is the agent's state directory; the runtime keeps one
	// directory per module in StateDir/process (mode 0700).
	StateDir string
	// Fetcher gives the runtime a build's bundle. Required.
	Fetcher Fetcher
	// Shim is the argv that runs a shim; the runtime appends the module's
	// directory. The command must call [shim.Main] with it (meshfold's is
	// meshfold-shim, or `meshfold shim DIR`, a hidden top-level command,
	// where none is installed). Required.
	Shim []string
	// ShimEnv is added to the shim's environment (tests mark their
	// re-executed binary with it).
	ShimEnv []string
	// Backoff paces restarts; zero fields take DESIGN.md §8's figures.
	Backoff Backoff
	// LogMaxMB caps a module's log file before it is rotated (default
	// 10); LogBackups is how many rotated files are kept (default 3).
	LogMaxMB, LogBackups int
	// Logger receives the runtime's log lines; nil uses slog.Default().
	Logger *slog.Logger
	// CgroupParent is the cgroup under which each module gets its own
	// (default DefaultCgroupParent); NoCgroups runs every module in its
	// process group below its shim, as where no cgroup can be made.
	CgroupParent string
	NoCgroups    bool
}

// Runtime is the process runtime: a [node.Runtime] whose modules are
// processes, each supervised by its own shim (see the package
// documentation). Create it with [Open]; it is safe for concurrent use.
type Runtime struct {
	cfg    Config
	dir    string // StateDir/process
	log    *slog.Logger
	asRoot bool
	me     shim.Account
	cgroup string // the parent of the modules' cgroups; "" when none can be made

	changes chan struct{}

	adoptOnce sync.Once // the shims of a previous agent are adopted on first use

	mu   sync.Mutex
	mods map[string]*module
	shut bool
	wg   sync.WaitGroup
}

var (
	_ node.Runtime       = (*Runtime)(nil)
	_ node.Supervisor    = (*Runtime)(nil)
	_ node.LogReader     = (*Runtime)(nil)
	_ node.AccountMapper = (*Runtime)(nil)
)

// module is one module the runtime holds.
type module struct {
	name string
	dir  string

	op sync.Mutex // serialises Apply, Remove and the recovery of a lost shim

	// Under Runtime.mu:
	spec     shim.Spec
	st       Status
	conn     *net.UnixConn // the watch connection; nil when none
	stopping bool          // a stop was asked: the end of the watch is expected
	warnedAs bool          // the log said the module does not run as its runs_as
}

// Open returns the runtime. It touches no shim: the shims a previous agent
// left running in StateDir/process are adopted on the runtime's first use
// (any method but Changes and Close), so that an agent refused by the
// node's lease, which uses it for nothing, never reaches the shims of the
// agent that holds it. Each is identified by the pid and start time it
// recorded, checked against /proc and against the peer of its socket, and
// its module by the pid and start time it reports. A module whose shim is
// gone is reported as stopped (its process, if it outlived the shim, is
// killed first), so the agent applies or removes it.
//
// Errors: a missing Node, Root, StateDir, Fetcher or Shim; the state
// directory cannot be created, or is another node's (matching
// [node.ErrStateDirOwned]).
func Open(cfg Config) (*Runtime, error) {
	switch {
	case !events.ValidName(cfg.Node):
		return nil, &events.FieldError{Field: "node", Value: cfg.Node, Err: events.ErrBadName}
	case cfg.Root == "", cfg.StateDir == "":
		return nil, errors.New("process: Root and StateDir are required")
	case cfg.Fetcher == nil:
		return nil, errors.New("process: a Fetcher is required")
	case len(cfg.Shim) == 0:
		return nil, errors.New("process: the shim command is required")
	}
	// MESHFOLD_ROOT and the shims' directories must not depend on the
	// working directory (a module's is its bundle).
	var err error
	if cfg.Root, err = filepath.Abs(cfg.Root); err != nil {
		return nil, fmt.Errorf("process: root: %w", err)
	}
	if cfg.StateDir, err = filepath.Abs(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("process: state dir: %w", err)
	}
	if cfg.LogMaxMB <= 0 {
		cfg.LogMaxMB = 10
	}
	if cfg.LogBackups <= 0 {
		cfg.LogBackups = 3
	}
	cfg.Backoff = cfg.Backoff.WithDefaults()
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	// The shims here are one node's: an agent of another name on the same
	// directory would adopt them and, its want empty, stop them and
	// delete their bundles (a fresh user's finding U19).
	adopted, err := node.ClaimStateDir(cfg.StateDir, cfg.Node)
	if err != nil {
		return nil, err
	}
	if adopted {
		node.LogAdopted(log, cfg.StateDir, cfg.Node)
	}
	dir := filepath.Join(cfg.StateDir, "process")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("process: state dir: %w", err)
	}
	me, err := lookupAccount("")
	if err != nil {
		return nil, fmt.Errorf("process: the agent's own user: %w", err)
	}
	r := &Runtime{cfg: cfg, dir: dir, log: log, asRoot: os.Geteuid() == 0, me: me,
		changes: make(chan struct{}, 1), mods: map[string]*module{}}
	if !r.asRoot {
		log.Warn("the agent is not root: every module runs as the agent's own user, not as its account", "user", me.Name, "uid", me.UID)
	}
	r.cgroup = cmp.Or(cfg.CgroupParent, DefaultCgroupParent)
	switch {
	case cfg.NoCgroups:
		r.cgroup = ""
	case !r.asRoot:
		r.cgroup = ""
		log.Warn("no cgroup can be made (the agent is not root): each module's tree is its process group and what its shim reaps; manifest limits are not applied")
	default:
		if err := shim.ProbeCgroups(r.cgroup); err != nil {
			r.cgroup = ""
			log.Warn("no cgroup can be made: each module's tree is its process group and what its shim reaps; manifest limits are not applied", "err", err)
		}
	}
	return r, nil
}

// ready adopts, once, the shims a previous agent left in the state
// directory. Every method that reads or changes the modules calls it
// first.
func (r *Runtime) ready() {
	r.adoptOnce.Do(func() {
		ents, err := os.ReadDir(r.dir)
		if err != nil {
			r.log.Error("state directory not read: no shim adopted", "dir", r.dir, "err", err)
			return
		}
		for _, e := range ents {
			if e.IsDir() && events.ValidName(e.Name()) {
				r.adopt(e.Name())
			}
		}
	})
}

// adopt takes over the shim of module name left by a previous agent.
func (r *Runtime) adopt(name string) {
	m := &module{name: name, dir: filepath.Join(r.dir, name)}
	log := r.log.With("module", name)
	if err := shim.ReadJSON(m.dir, shim.SpecFile, &m.spec); err != nil {
		log.Warn("module directory without a usable spec; deleted", "err", err)
		_ = os.RemoveAll(m.dir)
		return
	}
	r.mu.Lock()
	if r.shut {
		r.mu.Unlock()
		return
	}
	r.mods[name] = m
	r.mu.Unlock()
	st, conn, err := r.connect(m)
	if errors.Is(err, errShimProtocol) {
		log.Error("shim of another protocol: killed, with its module; the module is reported stopped", "err", err)
		r.killShim(m)
	} else if err != nil {
		log.Warn("shim gone; the module is reported stopped", "err", err)
	}
	if err != nil {
		r.reap(m)
		r.mu.Lock()
		m.st = Status{Module: name, Build: m.spec.Build, Account: m.spec.Account, State: events.Stopped, Since: time.Now().UTC(),
			Exit: "supervisor lost"}
		r.mu.Unlock()
		return
	}
	log.Info("module adopted", "pid", st.PID, "shim_pid", st.ShimPID, "state", st.State)
	r.watch(m, st, conn)
}

// connect reaches m's shim and checks it is the one that recorded itself:
// the socket's peer has the recorded pid, alive with the recorded start
// time, and the module it reports is alive with its reported start time.
// It returns the shim's status on a watch connection.
func (r *Runtime) connect(m *module) (Status, watchConn, error) {
	var id shim.Identity
	if err := shim.ReadJSON(m.dir, shim.ShimFile, &id); err != nil {
		return Status{}, watchConn{}, fmt.Errorf("shim identity: %w", err)
	}
	if !id.Live() {
		return Status{}, watchConn{}, fmt.Errorf("shim pid %d with start time %d in boot %q is not running", id.PID, id.Start, id.Boot)
	}
	c, err := shim.DialUnix(m.dir, shim.SockFile)
	if err != nil {
		return Status{}, watchConn{}, fmt.Errorf("shim socket: %w", err)
	}
	if pid, err := shim.PeerPID(c); err != nil || pid != id.PID {
		_ = c.Close()
		return Status{}, watchConn{}, fmt.Errorf("shim socket is served by pid %d, not the recorded %d (%v)", pid, id.PID, err)
	}
	if err := json.NewEncoder(c).Encode(shim.Request{Op: shim.OpWatch}); err != nil {
		_ = c.Close()
		return Status{}, watchConn{}, err
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	rd := bufio.NewReader(c)
	line, err := rd.ReadBytes('\n')
	_ = c.SetReadDeadline(time.Time{})
	var st Status
	if err == nil {
		err = json.Unmarshal(line, &st)
	}
	if err != nil {
		_ = c.Close()
		return Status{}, watchConn{}, fmt.Errorf("shim status: %w", err)
	}
	if st.ShimPID != id.PID || st.ShimStart != id.Start {
		_ = c.Close()
		return Status{}, watchConn{}, fmt.Errorf("shim reports pid %d start %d, recorded %d start %d", st.ShimPID, st.ShimStart, id.PID, id.Start)
	}
	if st.Speaks() != shim.Protocol {
		_ = c.Close()
		return Status{}, watchConn{}, fmt.Errorf("%w: it speaks protocol %d, this agent %d", errShimProtocol, st.Speaks(), shim.Protocol)
	}
	if st.PID != 0 && !shim.Alive(st.PID, st.PIDStart) {
		// The module exited between the report and the check: the watch
		// brings the next status.
		r.log.Debug("module process gone since the shim's report", "module", m.name, "pid", st.PID)
	}
	return st, watchConn{c, rd}, nil
}

// watchConn is a watch connection and its reader (which may already hold
// the shim's next statuses).
type watchConn struct {
	c  *net.UnixConn
	rd *bufio.Reader
}

// reap cleans up after a lost shim: its module's process, if it outlived
// the shim (it is killed with its group only when its recorded pid is
// still the process that started at the recorded time), and the socket.
func (r *Runtime) reap(m *module) {
	var id shim.Identity
	if err := shim.ReadJSON(m.dir, shim.ModuleFile, &id); err == nil && id.Live() {
		r.log.Warn("module process outlived its shim; killed", "module", m.name, "pid", id.PID)
		_ = syscall.Kill(-id.PID, syscall.SIGKILL)
		if !shim.WaitExit(id.PID, 10*time.Second) {
			r.log.Error("orphaned module process did not exit after SIGKILL", "module", m.name, "pid", id.PID)
		}
	}
	if r.cgroup != "" {
		// Whatever else of its tree outlived the shim is in its cgroup.
		if gone, err := shim.KillCgroup(r.cgroup, shim.CgroupName(m.name, m.dir)); err == nil && !gone {
			r.log.Error("processes of the module's cgroup did not exit after SIGKILL", "module", m.name)
		}
	} else if left := shim.KillByEnv([]string{"MESHFOLD_NODE=" + r.cfg.Node, "MESHFOLD_ROOT=" + r.cfg.Root, "MESHFOLD_MODULE=" + m.name}); left > 0 {
		// No cgroup: what left the process group and lost its subreaper
		// is found, best effort, by the environment the shim gave it.
		r.log.Warn("processes of the module outlived its shim; killed", "module", m.name, "count", left)
	}
	_ = os.Remove(filepath.Join(m.dir, shim.SockFile))
	_ = os.Remove(filepath.Join(m.dir, shim.ModuleFile))
}

// watch follows m's status on conn until the shim ends the connection.
func (r *Runtime) watch(m *module, st Status, wc watchConn) {
	conn := wc.c
	r.mu.Lock()
	if r.shut {
		// Closing: the shim runs on for the next runtime to adopt.
		r.mu.Unlock()
		_ = conn.Close()
		return
	}
	m.st, m.conn, m.stopping = st, conn, false
	r.wg.Add(1)
	r.mu.Unlock()
	r.changed()
	go func() {
		defer r.wg.Done()
		rd := wc.rd
		for {
			line, err := rd.ReadBytes('\n')
			if err != nil {
				break
			}
			var st Status
			if json.Unmarshal(line, &st) != nil {
				continue
			}
			r.mu.Lock()
			changed := st.State != m.st.State || st.Restarts != m.st.Restarts || st.FillRestarts != m.st.FillRestarts || st.PID != m.st.PID || st.Health != m.st.Health
			if m.conn == conn {
				m.st = st
			}
			r.mu.Unlock()
			if changed {
				r.changed()
			}
		}
		_ = conn.Close()
		r.mu.Lock()
		expected := m.stopping || m.conn != conn || r.shut
		if m.conn == conn {
			m.conn = nil
		}
		r.mu.Unlock()
		if !expected {
			r.lost(m)
		}
	}()
}

// lost handles a shim that ended without being asked: its module is
// reported failed and a new shim starts it again.
func (r *Runtime) lost(m *module) {
	r.log.Warn("shim exited unexpectedly; starting a new one", "module", m.name)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shut {
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		m.op.Lock()
		defer m.op.Unlock()
		r.mu.Lock()
		if r.shut || m.conn != nil || r.mods[m.name] != m {
			r.mu.Unlock()
			return
		}
		sp := m.spec
		sp.Restarts, sp.FillRestarts = m.st.Restarts+1, m.st.FillRestarts
		r.mu.Unlock()
		var id shim.Identity
		if shim.ReadJSON(m.dir, shim.ShimFile, &id) == nil && id.Live() {
			// Only the connection was lost: watch the shim again, or, if
			// it does not answer, make sure it is gone before another
			// one starts.
			if st, wc, err := r.connect(m); err == nil {
				r.watch(m, st, wc)
				return
			}
			_ = syscall.Kill(id.PID, syscall.SIGKILL)
			shim.WaitExit(id.PID, 10*time.Second)
		}
		r.mu.Lock()
		m.st.State, m.st.PID, m.st.Exit, m.st.Since = events.Failed, 0, "supervisor lost", time.Now().UTC()
		r.mu.Unlock()
		r.changed()
		r.reap(m)
		if err := r.startShim(context.Background(), m, sp); err != nil {
			r.log.Error("new shim not started", "module", m.name, "err", err)
		}
	}()
}

func (r *Runtime) changed() {
	select {
	case r.changes <- struct{}{}:
	default:
	}
}

// Changes receives a value whenever a module's state changes (coalesced).
func (r *Runtime) Changes() <-chan struct{} { return r.changes }

// Apply makes module m run its build as its account: it fetches the
// bundle, resolves the account and, unless the module's shim already runs
// that very build as that account, stops the old shim and starts a new
// one. It returns once the module's process started, or once its first
// start failed (the shim then retries it with backoff): a module that
// crashes still counts as applied (DESIGN.md §8).
//
// Errors: an invalid name or empty build; an empty runs_as when the agent
// is root (matching ErrNoRunsAs: no module runs as root unless its want
// says runs_as "root"); the Fetcher's error; an unknown user (matching
// ErrUnknownUser); a shim that cannot be started.
func (r *Runtime) Apply(ctx context.Context, row events.PlanModule) error {
	r.ready()
	if !events.ValidName(row.Name) {
		return &events.FieldError{Field: "name", Value: row.Name, Err: events.ErrBadName}
	}
	if row.Build == "" {
		return fmt.Errorf("apply %s: %w", row.Name, &events.FieldError{Field: "build", Err: events.ErrMissing})
	}
	if row.RunsAs == "" && r.asRoot {
		return fmt.Errorf("module %s: %w", row.Name, ErrNoRunsAs)
	}
	dir, man, err := r.cfg.Fetcher.Fetch(ctx, row.Build)
	if err != nil {
		return fmt.Errorf("apply %s: bundle %s: %w", row.Name, row.Build, err)
	}
	if err := man.Validate(); err != nil {
		return fmt.Errorf("apply %s: bundle %s: %w", row.Name, row.Build, err)
	}
	acct, err := lookupAccount(row.RunsAs)
	if errors.Is(err, ErrUnknownUser) {
		return fmt.Errorf("%w (runs_as of module %s)", err, row.Name)
	}
	if err != nil {
		return fmt.Errorf("apply %s: runs_as: %w", row.Name, err)
	}
	sp := r.spec(row, dir, man, acct)

	m := r.module(row.Name)
	m.op.Lock()
	defer m.op.Unlock()
	if !r.asRoot && row.RunsAs != r.me.Name {
		r.mu.Lock()
		warn := !m.warnedAs
		m.warnedAs = true
		r.mu.Unlock()
		if warn {
			r.log.Warn("the agent is not root: the module runs as the agent's own user, not as its runs_as", "module", row.Name, "runs_as", row.RunsAs, "user", r.me.Name)
		}
	}
	r.mu.Lock()
	cur, live := m.spec, m.conn != nil
	r.mu.Unlock()
	if live && cur.Same(sp) {
		if !slices.Equal(cur.Files, sp.Files) {
			// The files it declares changed: its shim reads them from
			// spec.json to keep their content out of its log.
			cur.Files = sp.Files
			if err := shim.WriteJSON(m.dir, shim.SpecFile, cur); err != nil {
				return fmt.Errorf("apply %s: %w", row.Name, err)
			}
			r.mu.Lock()
			m.spec = cur
			r.mu.Unlock()
		}
		return nil // the shim runs it (or restarts it with backoff)
	}
	if live {
		if err := r.stopShim(ctx, m); err != nil {
			return fmt.Errorf("apply %s: stop the running build: %w", row.Name, err)
		}
	}
	if err := r.startShim(ctx, m, sp); err != nil {
		return fmt.Errorf("apply %s: %w", row.Name, err)
	}
	r.prune(ctx)
	return nil
}

// spec composes what the shim of row runs.
func (r *Runtime) spec(row events.PlanModule, dir string, man bundle.Manifest, acct shim.Account) shim.Spec {
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"MESHFOLD_NODE=" + r.cfg.Node,
		"MESHFOLD_MODULE=" + row.Name,
		"MESHFOLD_ROOT=" + r.cfg.Root,
	}
	runAs := acct
	if !r.asRoot {
		runAs = r.me
	}
	env = append(env, "USER="+runAs.Name, "LOGNAME="+runAs.Name)
	if runAs.Home != "" {
		env = append(env, "HOME="+runAs.Home)
	}
	keys := make([]string, 0, len(man.Env))
	for k := range man.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = slices.DeleteFunc(env, func(e string) bool { return strings.HasPrefix(e, k+"=") })
		env = append(env, k+"="+man.Env[k])
	}
	for _, e := range shim.NotifyEnv(row.Name, filepath.Join(r.dir, row.Name), man.Health) {
		k, _, _ := strings.Cut(e, "=")
		env = slices.DeleteFunc(env, func(e string) bool { return strings.HasPrefix(e, k+"=") })
		env = append(env, e)
	}
	restart, sig := man.FillAction()
	sp := shim.Spec{
		Protocol: shim.Protocol,
		Module:   row.Name, Build: row.Build, Account: row.RunsAs,
		Dir: dir, Argv: man.Command, Env: env,
		StopSignal: int(man.Signal()), StopTimeout: man.Timeout(),
		OnFillRestart: restart, OnFillSignal: int(sig),
		Backoff: r.cfg.Backoff, LogMaxMB: r.cfg.LogMaxMB, LogBackups: r.cfg.LogBackups,
		Cgroup: r.cgroup, Limits: man.Limits, Health: man.Health,
	}
	for _, f := range row.Files {
		sp.Files = append(sp.Files, filepath.Join(r.cfg.Root, f.Path))
	}
	if r.asRoot {
		sp.User = &acct
	}
	sp.As = runAs.Name
	return sp
}

// runningAs returns the account sp's process runs as. A spec written
// before As existed: User's, else the shim's user, the agent's.
func (r *Runtime) runningAs(sp shim.Spec) string {
	switch {
	case sp.As != "":
		return sp.As
	case sp.User != nil:
		return sp.User.Name
	}
	return r.me.Name
}

// RunningAs returns the account a module whose row says runsAs runs as,
// which its have reports: runsAs itself when the agent is root, else the
// agent's own user (see [node.AccountMapper]).
func (r *Runtime) RunningAs(runsAs string) string {
	if r.asRoot {
		return runsAs
	}
	return r.me.Name
}

// module returns the runtime's entry for name, creating it.
func (r *Runtime) module(name string) *module {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.mods[name]
	if m == nil {
		m = &module{name: name, dir: filepath.Join(r.dir, name)}
		r.mods[name] = m
	}
	return m
}

// startShim starts a shim for sp and waits for its first start of the
// module. Called with m.op held.
func (r *Runtime) startShim(ctx context.Context, m *module, sp shim.Spec) error {
	if err := os.MkdirAll(m.dir, 0o700); err != nil {
		return err
	}
	// Its own cgroup, never one of a shim that ran at this path before
	// the state directory was made again (see shim.CgroupName).
	if err := shim.EnsureInstance(m.dir); err != nil {
		return fmt.Errorf("module directory: %w", err)
	}
	sp.Since = time.Now().UTC()
	for _, f := range []string{shim.ShimFile, shim.ModuleFile, shim.SockFile} {
		_ = os.Remove(filepath.Join(m.dir, f))
	}
	if err := shim.WriteJSON(m.dir, shim.SpecFile, sp); err != nil {
		return fmt.Errorf("write the shim's spec: %w", err)
	}
	r.mu.Lock()
	m.spec = sp
	r.mu.Unlock()
	slog, err := os.OpenFile(filepath.Join(m.dir, shim.ShimLog), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer slog.Close()
	rd, wr, err := os.Pipe()
	if err != nil {
		return err
	}
	defer rd.Close()
	cmd := exec.Command(r.cfg.Shim[0], append(slices.Clone(r.cfg.Shim[1:]), m.dir)...)
	cmd.Env = append(append(os.Environ(), shimRuntimeEnv...), r.cfg.ShimEnv...)
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = slog, slog
	cmd.ExtraFiles = []*os.File{wr}
	// Its own session: a signal to the agent's terminal or process group
	// does not reach it, and it outlives the agent.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	_ = wr.Close()
	if err != nil {
		return fmt.Errorf("start the shim: %w", err)
	}
	// Reap the shim if it exits while this agent runs; a later agent is
	// not its parent and need not.
	go func() { _ = cmd.Wait() }()

	type first struct {
		st  Status
		err error
	}
	got := make(chan first, 1)
	go func() {
		var st Status
		err := json.NewDecoder(rd).Decode(&st)
		got <- first{st, err}
	}()
	var f first
	select {
	case f = <-got:
	case <-ctx.Done():
		_ = rd.Close()
		return ctx.Err()
	}
	if f.err != nil {
		return fmt.Errorf("the shim exited before starting the module (see %s): %w", filepath.Join(m.dir, shim.ShimLog), f.err)
	}
	st, conn, err := r.connect(m)
	if errors.Is(err, errShimProtocol) {
		r.killShim(m)
		r.reap(m)
	}
	if err != nil {
		return fmt.Errorf("reach the shim: %w", err)
	}
	r.log.Info("module started", "module", m.name, "pid", st.PID, "state", st.State, "shim_pid", st.ShimPID)
	r.watch(m, st, conn)
	return nil
}

// errShimProtocol: a shim reports a protocol other than this runtime's
// (shim.Protocol); the runtime does not drive it.
var errShimProtocol = errors.New("shim of another protocol")

// killShim SIGKILLs m's shim, identified by its recorded pid and start
// time, and waits for it to go (its module's tree is left to reap).
func (r *Runtime) killShim(m *module) {
	var id shim.Identity
	if shim.ReadJSON(m.dir, shim.ShimFile, &id) == nil && id.Live() {
		_ = syscall.Kill(id.PID, syscall.SIGKILL)
		shim.WaitExit(id.PID, 10*time.Second)
	}
}

// stopShim asks m's shim to stop the module and exit, and waits until the
// shim process is gone: the next shim of the module may then use the
// directory. A shim that does not answer, or does not exit within the
// stop timeout and a margin, is killed (identified by its recorded pid and
// start time), and so is what it left of its module. Called with m.op
// held.
func (r *Runtime) stopShim(ctx context.Context, m *module) error {
	r.mu.Lock()
	m.stopping = true
	timeout := m.spec.StopTimeout
	r.mu.Unlock()
	var id shim.Identity
	haveID := shim.ReadJSON(m.dir, shim.ShimFile, &id) == nil && id.Live()
	err := errors.New("no shim runs")
	var st Status
	if haveID {
		st, err = r.ask(ctx, m, shim.OpStop)
	}
	if err != nil && haveID {
		r.log.Warn("shim did not answer the stop", "module", m.name, "err", err)
	} else if err == nil {
		r.mu.Lock()
		m.st = st
		r.mu.Unlock()
	}
	if haveID && id.Live() && !shim.WaitExit(id.PID, timeout+5*time.Second) && id.Live() {
		r.log.Warn("shim did not exit after the stop; killed", "module", m.name, "pid", id.PID)
		_ = syscall.Kill(id.PID, syscall.SIGKILL)
		shim.WaitExit(id.PID, 10*time.Second)
	}
	r.reap(m)
	r.mu.Lock()
	if err != nil {
		m.st.State, m.st.PID, m.st.PIDStart, m.st.Since = events.Stopped, 0, 0, time.Now().UTC()
	}
	r.mu.Unlock()
	r.changed()
	return nil
}

// ask sends op to m's shim on a new connection and returns its reply.
func (r *Runtime) ask(ctx context.Context, m *module, op string) (Status, error) {
	return r.send(ctx, m, shim.Request{Op: op})
}

// send sends req to m's shim on a new connection and returns its reply.
func (r *Runtime) send(ctx context.Context, m *module, req shim.Request) (Status, error) {
	c, err := shim.DialUnix(m.dir, shim.SockFile)
	if err != nil {
		return Status{}, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return Status{}, err
	}
	var st Status
	if err := json.NewDecoder(c).Decode(&st); err != nil {
		return Status{}, err
	}
	return st, nil
}

// Remove stops the module's whole tree (the stop signal to each of its
// processes, then SIGKILL to what is left after the stop timeout), ends
// its shim and
// deletes its directory (spec, logs). Removing a module the runtime does
// not hold is not an error.
func (r *Runtime) Remove(ctx context.Context, name string) error {
	r.ready()
	if !events.ValidName(name) {
		return &events.FieldError{Field: "name", Value: name, Err: events.ErrBadName}
	}
	r.mu.Lock()
	m := r.mods[name]
	r.mu.Unlock()
	if m == nil {
		return nil
	}
	m.op.Lock()
	defer m.op.Unlock()
	if err := r.stopShim(ctx, m); err != nil {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	if err := os.RemoveAll(m.dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	r.mu.Lock()
	if r.mods[name] == m {
		delete(r.mods, name)
	}
	r.mu.Unlock()
	r.changed()
	r.prune(ctx)
	return nil
}

// Running reports every module the runtime holds, sorted by name.
func (r *Runtime) Running(ctx context.Context) ([]events.HaveModule, error) {
	r.ready()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]events.HaveModule, 0, len(r.mods))
	for _, m := range r.mods {
		st := m.st
		if st.Module == "" {
			continue // being started for the first time
		}
		h := events.HaveModule{Name: m.name, Build: st.Build, State: st.State, Account: r.runningAs(m.spec),
			Restarts: st.Restarts, FillRestarts: st.FillRestarts, Exit: printable(st.Exit), Health: st.Health}
		if !st.Since.IsZero() {
			since := st.Since.UTC().Truncate(time.Millisecond)
			h.Since = &since
		}
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b events.HaveModule) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Status returns what m's shim last reported (ok false when the runtime
// does not hold the module).
func (r *Runtime) Status(name string) (Status, bool) {
	r.ready()
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.mods[name]
	if m == nil {
		return Status{}, false
	}
	return m.st, true
}

// fillWakeTimeout bounds how long a fill waits for the module's shim to
// take the wake.
const fillWakeTimeout = 2 * time.Second

// Filled tells module's shim that one of its filled files was written: a
// module waiting out its backoff starts at once, a running one gets its
// manifest's on_fill action. It returns without waiting for either.
func (r *Runtime) Filled(ctx context.Context, name string) {
	r.ready()
	r.mu.Lock()
	m := r.mods[name]
	r.mu.Unlock()
	if m == nil {
		return
	}
	// The fill's reply waits for this: a shim that does not answer within
	// a moment is not waited for (it is restarted when its watch ends).
	// The file is written before Filled is called: a process the shim
	// starts after this moment saw it and gets no on_fill action.
	at := shim.BootNanos()
	ctx, cancel := context.WithTimeout(ctx, fillWakeTimeout)
	defer cancel()
	if _, err := r.send(ctx, m, shim.Request{Op: shim.OpWake, At: at}); err != nil {
		r.log.Warn("fill not passed to the module's shim", "module", name, "err", err)
	}
}

// prune tells a Pruner which builds are still in use.
func (r *Runtime) prune(ctx context.Context) {
	p, ok := r.cfg.Fetcher.(Pruner)
	if !ok {
		return
	}
	r.mu.Lock()
	var keep []string
	for _, m := range r.mods {
		if m.spec.Build != "" && !slices.Contains(keep, m.spec.Build) {
			keep = append(keep, m.spec.Build)
		}
	}
	r.mu.Unlock()
	slices.Sort(keep)
	if err := p.Prune(ctx, keep); err != nil {
		r.log.Warn("bundle cache not pruned", "err", err)
	}
}

// Close lets go of the shims without stopping them: the modules keep
// running, and the next [Open] adopts them. It is what an agent that
// stops does.
func (r *Runtime) Close() error {
	r.mu.Lock()
	r.shut = true
	for _, m := range r.mods {
		if m.conn != nil {
			_ = m.conn.Close()
		}
	}
	r.mu.Unlock()
	r.wg.Wait()
	return nil
}

// StopAll stops every module and its shim (the modules do not outlive
// this call), keeping their directories. Tests and an operator's full
// shutdown use it.
func (r *Runtime) StopAll(ctx context.Context) {
	r.ready()
	r.mu.Lock()
	mods := make([]*module, 0, len(r.mods))
	for _, m := range r.mods {
		mods = append(mods, m)
	}
	r.mu.Unlock()
	for _, m := range mods {
		m.op.Lock()
		_ = r.stopShim(ctx, m)
		m.op.Unlock()
	}
}

// shimRuntimeEnv tunes the Go runtime of every shim, in its environment
// so that it holds from the process's first instruction (a module's
// environment is its spec's, never the shim's): a shim supervises one
// module and needs one P. With 100 modules of sleep it lowers a shim's
// PSS by about 0.3 MB (issue 27, BenchmarkShimMemory; docs/architecture.md).
var shimRuntimeEnv = []string{"GOMAXPROCS=1"}

// printable makes an exit fit a have (events.MaxExit bytes, no control
// characters).
func printable(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > events.MaxExit {
		s = s[:events.MaxExit-3]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		s += "..."
	}
	return s
}
