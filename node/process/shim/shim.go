package shim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"golang.org/x/sys/unix"
	"gopkg.in/natefinch/lumberjack.v2"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node/bundle/runspec"
)

// readyFD is the descriptor a shim reports its first start on (the
// runtime passes a pipe as its first extra file).
const readyFD = 3

// Main runs a shim: the supervisor of one module, whose directory
// (<state dir>/process/<module>) holds its spec.json. The runtime starts
// it as its configured shim command with that directory as the last
// argument (meshfold-shim DIR, or `meshfold shim DIR`). It returns the process's
// exit code: 0 after a stop request or SIGTERM, 2 when the spec is
// unusable or of another [Protocol].
func Main(dir string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var sp Spec
	if err := ReadJSON(dir, SpecFile, &sp); err != nil {
		log.Error("shim: read spec", "dir", dir, "err", err)
		return 2
	}
	if p := max(sp.Protocol, 1); p != Protocol {
		log.Error("shim: the spec is of another protocol; refused", "dir", dir, "spec_protocol", p, "protocol", Protocol)
		return 2
	}
	// The shim's own log is capped like the module's: its stderr (where
	// a Go panic would go) stays the file the runtime opened.
	own := &lumberjack.Logger{Filename: filepath.Join(dir, ShimLog), MaxSize: max(sp.LogMaxMB, 1), MaxBackups: max(sp.LogBackups, 1)}
	defer own.Close()
	log = slog.New(slog.NewTextHandler(own, nil))
	s := newShim(dir, sp, log.With("module", sp.Module))
	if err := s.run(); err != nil {
		s.log.Error("shim: stopped", "err", err)
		return 2
	}
	return 0
}

// shim supervises one module's process.
type shim struct {
	dir   string
	spec  Spec
	log   *slog.Logger
	out   *lumberjack.Logger
	lines *lineWriter // tags the lines written to out
	self  Identity
	reap  *reaper
	cg    modCgroup // nil: no cgroup could be made
	tree  tree

	mu       sync.Mutex
	st       Status
	watchers map[chan Status]struct{}
	wakes    uint64 // fills seen; the loop compares against the count at start
	wokeAt   int64  // the newest fill's time (boottime ns, the agent's clock and ours), 0 if unknown

	replies sync.WaitGroup // stop requests not answered yet

	wake   chan struct{} // 1-buffered: a fill arrived
	notes  chan []byte   // notify messages from the module's processes
	sick   chan struct{} // 1-buffered: the check found the module unhealthy, to be restarted
	stop   context.Context
	cancel context.CancelFunc
	done   chan struct{} // the supervisor loop ended

	// unlisten closes the listener and removes the socket, once. A stop
	// calls it before its reply: the agent starts the next shim of the
	// module (same socket path) only after that reply, so the old shim's
	// cleanup can never delete the new shim's socket.
	unlisten func()
}

func newShim(dir string, sp Spec, log *slog.Logger) *shim {
	stop, cancel := context.WithCancel(context.Background())
	out := &lumberjack.Logger{
		Filename:   filepath.Join(dir, LogFile),
		MaxSize:    max(sp.LogMaxMB, 1),
		MaxBackups: max(sp.LogBackups, 1),
	}
	return &shim{
		dir:      dir,
		spec:     sp,
		log:      log,
		out:      out,
		lines:    &lineWriter{out: out},
		watchers: map[chan Status]struct{}{},
		wake:     make(chan struct{}, 1),
		notes:    make(chan []byte, 16),
		sick:     make(chan struct{}, 1),
		stop:     stop,
		cancel:   cancel,
		done:     make(chan struct{}),
	}
}

func (s *shim) run() error {
	defer s.out.Close()
	pid := os.Getpid()
	start, err := StartTime(pid)
	if err != nil {
		return fmt.Errorf("own start time: %w", err)
	}
	s.self = Identity{PID: pid, Start: start, Boot: BootID()}
	s.st = Status{Module: s.spec.Module, Build: s.spec.Build, Account: s.spec.Account, State: events.Stopped,
		Restarts: s.spec.Restarts, FillRestarts: s.spec.FillRestarts, Since: time.Now().UTC(), ShimPID: pid, ShimStart: start,
		Protocol: Protocol}
	if s.reap, err = newReaper(); err != nil {
		return fmt.Errorf("become a child subreaper: %w", err)
	}
	s.makeCgroup()
	defer s.removeCgroup()
	if err := WriteJSON(s.dir, ShimFile, s.self); err != nil {
		return fmt.Errorf("write %s: %w", ShimFile, err)
	}
	l, err := ListenUnix(s.dir, SockFile)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	sock := filepath.Join(s.dir, SockFile)
	own, _ := os.Stat(sock)
	s.unlisten = sync.OnceFunc(func() {
		_ = l.Close()
		// Only our own socket: never one a newer shim bound at this path.
		if fi, err := os.Stat(sock); err == nil && own != nil && os.SameFile(own, fi) {
			_ = os.Remove(sock)
		}
	})
	defer s.unlisten()
	go s.accept(l)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	go func() {
		select {
		case sig := <-sigs:
			s.log.Info("shim: signalled; stopping the module", "signal", sig)
			s.cancel()
		case <-s.stop.Done():
		}
	}()

	if h := s.spec.Health; h != nil && h.Notify {
		if err := s.listenNotify(); err != nil {
			s.log.Warn("shim: no notify socket; the module stays starting", "err", err)
			s.note("no notify socket could be made (%v)", err)
		}
	}
	ready := os.NewFile(readyFD, "ready")
	go s.supervise(ready)
	<-s.done
	// Answer the stop requests before exiting, or the runtime would take
	// the lost reply for a mute shim.
	s.replies.Wait()
	s.log.Info("shim: module stopped; exiting")
	return nil
}

// makeCgroup gives the module its cgroup, with its limits, when the
// runtime could make cgroups; a failure here leaves the module in its
// process group below the subreaper, and says so in its log. What a
// previous shim of the module left in the cgroup is killed first.
func (s *shim) makeCgroup() {
	if s.spec.Cgroup == "" {
		return
	}
	var l runspec.Limits
	if s.spec.Limits != nil {
		l = *s.spec.Limits
	}
	cg, err := newCgroup(s.spec.Cgroup, CgroupName(s.spec.Module, s.dir), l)
	if err != nil {
		s.log.Warn("shim: no cgroup; the module runs in its process group, without limits", "err", err)
		s.note("no cgroup could be made (%v): the module runs without its limits", err)
		return
	}
	s.cg, s.tree = cg, tree{cg: cg}
	if _, gone := s.tree.stop(0, 0); !gone {
		s.log.Warn("shim: processes left in the module's cgroup outlived SIGKILL")
	}
}

// removeCgroup deletes the module's cgroup once its tree is gone.
func (s *shim) removeCgroup() {
	if s.cg == nil {
		return
	}
	s.tree.stop(0, 0)
	if err := s.cg.remove(); err != nil {
		s.log.Warn("shim: the module's cgroup not removed", "err", err)
	}
}

// accept serves the runtime's connections until l is closed.
func (s *shim) accept(l *net.UnixListener) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		go s.serve(c)
	}
}

// serve answers one connection: one request, its reply (or, for watch,
// a stream of statuses).
func (s *shim) serve(c *net.UnixConn) {
	defer c.Close()
	var req Request
	if err := json.NewDecoder(bufio.NewReader(io.LimitReader(c, 4096))).Decode(&req); err != nil {
		return
	}
	enc := json.NewEncoder(c)
	switch req.Op {
	case OpStatus:
		_ = enc.Encode(s.status())
	case OpWake:
		s.mu.Lock()
		s.wakes++
		s.wokeAt = max(s.wokeAt, req.At)
		st := s.st
		s.mu.Unlock()
		select {
		case s.wake <- struct{}{}:
		default:
		}
		_ = enc.Encode(st)
	case OpStop:
		s.replies.Add(1)
		defer s.replies.Done()
		s.cancel()
		<-s.done
		s.unlisten()
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_ = enc.Encode(s.status())
	case OpWatch:
		ch := make(chan Status, 1)
		s.mu.Lock()
		ch <- s.st
		s.watchers[ch] = struct{}{}
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			delete(s.watchers, ch)
			s.mu.Unlock()
		}()
		// A closed connection is seen by the next write, or by the read
		// below returning.
		gone := make(chan struct{})
		go func() { _, _ = io.Copy(io.Discard, c); close(gone) }()
		for {
			select {
			case st := <-ch:
				if err := enc.Encode(st); err != nil {
					return
				}
			case <-gone:
				return
			case <-s.done:
				// Deliver the last status, then end the stream.
				select {
				case st := <-ch:
					_ = enc.Encode(st)
				default:
				}
				return
			}
		}
	}
}

func (s *shim) status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

// set changes the status under the lock and tells every watcher.
func (s *shim) set(f func(*Status)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.st.State
	f(&s.st)
	if s.st.State != prev {
		s.st.Since = time.Now().UTC()
	}
	for ch := range s.watchers {
		select {
		case <-ch:
		default:
		}
		ch <- s.st
	}
}

// note writes one line of the shim's own into the module's log, so
// `meshfold logs` shows why a module restarted.
func (s *shim) note(format string, args ...any) {
	s.lines.line(StreamShim, fmt.Appendf(nil, "meshfold: "+format, args...))
}

// supervise runs the module until the shim is told to stop: start,
// wait, restart with backoff; a fill ends a backoff at once. The first
// start's outcome is written to ready, which is then closed.
func (s *shim) supervise(ready *os.File) {
	defer close(s.done)
	bo := s.spec.Backoff.WithDefaults()
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(bo.Initial),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0),
		backoff.WithMaxInterval(bo.Max),
		backoff.WithMaxElapsedTime(0),
	)
	first := true
	// restarts is what the next start adds to the restart count: 1 after
	// a backoff. It is counted in the start's own status, not before it:
	// counted at the backoff's end, the status said "failed, one restart
	// more" with nothing new, and the agent's have of it was followed by
	// one a second later that only the new failure's time told apart,
	// which audit showed as "unchanged" after every restart of a crash
	// loop (a fresh user's finding m4).
	restarts := 0
	for {
		s.mu.Lock()
		seen := s.wakes
		s.mu.Unlock()
		s.forget()
		began := time.Now()
		p, err := s.start()
		if err != nil {
			s.note("start failed: %v", err)
			s.set(func(st *Status) {
				st.State, st.PID, st.PIDStart, st.Exit, st.Restarts = events.Failed, 0, 0, "start: "+err.Error(), st.Restarts+restarts
			})
		} else {
			s.set(func(st *Status) {
				st.State, st.PID, st.PIDStart, st.Backoff, st.Restarts = events.Running, p.pid, p.start, 0, st.Restarts+restarts
			})
		}
		restarts = 0
		if first {
			first = false
			if ready != nil {
				_ = json.NewEncoder(ready).Encode(s.status())
				_ = ready.Close()
			}
		}
		if p != nil {
			endCheck := s.startCheck(p)
			exit, stopped := s.wait(p, seen)
			endCheck()
			if stopped {
				s.set(func(st *Status) {
					st.State, st.PID, st.PIDStart, st.Exit, st.Backoff, st.Health = events.Stopped, 0, 0, exit, 0, ""
				})
				return
			}
			if exit == "" { // restarted for a fill (on_fill restart): not a crash
				// Running still, but a new process: its since is now (a
				// fresh user's finding: `state` said running since before
				// the rotation, and a rotation gated on it read minutes).
				s.set(func(st *Status) { st.FillRestarts, st.Since = st.FillRestarts+1, time.Now().UTC() })
				continue
			}
			if time.Since(began) >= bo.Reset {
				b.Reset()
			}
			s.set(func(st *Status) { st.State, st.PID, st.PIDStart, st.Exit = events.Failed, 0, 0, exit })
		}
		if s.spec.Health != nil {
			s.set(func(st *Status) { st.Health = events.Unhealthy }) // not running: no check can pass
		}
		d := b.NextBackOff()
		if p != nil {
			s.note("exited: %s; next start in %s", s.status().Exit, d)
		} else {
			s.note("next start in %s", d)
		}
		s.set(func(st *Status) { st.Backoff = d })
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-s.wake:
			t.Stop()
			s.note("a filled file was written: starting now")
		case <-s.stop.Done():
			t.Stop()
			s.set(func(st *Status) { st.State, st.Backoff, st.Health = events.Stopped, 0, "" })
			return
		}
		restarts = 1
	}
}

// forget drops what the previous run said to the checker (its notify
// messages, its sickness), before the next run starts: the new run's
// first words may come before its checker does.
func (s *shim) forget() {
	for {
		select {
		case <-s.notes:
		case <-s.sick:
		default:
			return
		}
	}
}

// startCheck starts the check of run p, if the module has one; the
// returned func ends it and waits until it has ended.
func (s *shim) startCheck(p *proc) (end func()) {
	if s.spec.Health == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(s.stop)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.check(ctx, p, s.sick)
	}()
	return func() {
		cancel()
		<-done
	}
}

// proc is one started module process.
type proc struct {
	proc   *os.Process
	pid    int
	start  uint64
	began  int64         // boottime ns taken just before the exec: the process opens any file after it
	ooms   uint64        // the cgroup's OOM kills before it started
	exited chan string   // the exit description, once the process is reaped
	copied chan struct{} // closed once its stdout and stderr are copied to their end
}

// drained waits until p's output is all in the log (its pipes end once
// no process of its tree holds them), so the shim's note of an exit comes
// after the module's last lines. While lines keep coming it waits on (a
// loaded machine copies a full pipe slowly); it gives up after a second
// without a line (a pipe held by a process outside the tree), and after
// drainMax in all.
func (s *shim) drained(p *proc) {
	end := time.Now().Add(drainMax)
	for {
		n := s.lines.written()
		t := time.NewTimer(time.Second)
		select {
		case <-p.copied:
			t.Stop()
			return
		case <-t.C:
		}
		if s.lines.written() == n || time.Now().After(end) {
			return
		}
	}
}

// drainMax bounds how long a run's output is waited for after its exit.
const drainMax = 30 * time.Second

// start starts the module's command in its own process group, in the
// module's cgroup when there is one, as its account, stdout and stderr
// into the module's log.
func (s *shim) start() (*proc, error) {
	sp := s.spec
	argv0 := sp.Argv[0]
	if !filepath.IsAbs(argv0) {
		argv0 = filepath.Join(sp.Dir, argv0)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		_ = outR.Close()
		_ = outW.Close()
		return nil, err
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		for _, f := range []*os.File{outR, outW, errR, errW} {
			_ = f.Close()
		}
		return nil, err
	}
	attr := &os.ProcAttr{Dir: sp.Dir, Env: sp.Env, Files: []*os.File{null, outW, errW},
		Sys: s.sysAttr()}
	p := &proc{began: BootNanos(), exited: make(chan string, 1), copied: make(chan struct{})}
	if s.cg != nil {
		p.ooms = s.cg.ooms()
	}
	pr, ws, err := s.spawn(attr, argv0, sp.Argv)
	for _, f := range []*os.File{null, outW, errW} {
		_ = f.Close()
	}
	if err != nil {
		_ = outR.Close()
		_ = errR.Close()
		return nil, startError(err, sp.Dir)
	}
	p.proc, p.pid = pr, pr.Pid
	p.start, _ = StartTime(p.pid)
	if err := WriteJSON(s.dir, ModuleFile, Identity{PID: p.pid, Start: p.start, Boot: BootID()}); err != nil {
		s.log.Warn("shim: module identity not recorded", "err", err)
	}
	var copies sync.WaitGroup
	copies.Go(func() { s.lines.copyLines(StreamOut, outR); _ = outR.Close() })
	copies.Go(func() { s.lines.copyLines(StreamErr, errR); _ = errR.Close() })
	go func() { copies.Wait(); close(p.copied) }()
	go func() {
		st := <-ws
		_ = pr.Release()
		p.exited <- describeStatus(st)
	}()
	s.log.Info("shim: module started", "pid", p.pid, "build", sp.Build)
	return p, nil
}

// startError is a failed start's error: when the working directory dir
// is gone, it says so, where the exec's error blamed the command
// ("fork/exec /bin/sh: no such file or directory", though /bin/sh
// exists: the chdir into dir failed; a fresh user's finding U19, after
// another node's agent deleted the bundles).
func startError(err error, dir string) error {
	if dir == "" || !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if _, serr := os.Stat(dir); !errors.Is(serr, fs.ErrNotExist) {
		return err
	}
	if !filepath.IsAbs(dir) {
		// The shim runs in "/": a relative directory is not the one the
		// agent made (a relative --state-dir: a fresh user's finding).
		return fmt.Errorf("working directory %s is relative, and the shim runs in /: give the agent an absolute --state-dir: %w", dir, fs.ErrNotExist)
	}
	return fmt.Errorf("working directory %s does not exist (the module's bundle directory, removed since the module was applied): %w", dir, fs.ErrNotExist)
}

// sysAttr is how every process of the module starts: its own process
// group, as the module's account with exactly the account's groups, and
// killed by the kernel should the shim die (a shim killed -9, by the OOM
// killer or a stop of the shims' scope, cannot stop its module: without
// this the module ran on orphaned, supervised by nothing, and the node's
// next agent refused to start beside it; a fresh user's finding F3, see
// docs/architecture.md "A module does not outlive its shim"). Go sets the
// parent-death signal after the switch to the account's uid, which would
// clear it; an exec of a set-user-ID or file-capability binary still
// clears it, and a process the module forks does not inherit it: what
// is left is the next agent's to kill (the runtime's reap).
func (s *shim) sysAttr() *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if u := s.spec.User; u != nil {
		a.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}
	return a
}

// spawn starts argv in the module's cgroup (when it has one) and hands
// its exit to the reaper.
func (s *shim) spawn(attr *os.ProcAttr, argv0 string, argv []string) (*os.Process, <-chan unix.WaitStatus, error) {
	return s.reap.spawn(func() (*os.Process, error) {
		start := func() (*os.Process, error) { return os.StartProcess(argv0, argv, attr) }
		if s.cg != nil {
			return s.cg.spawn(attr.Sys, start)
		}
		return start()
	})
}

// wait waits for p to exit and returns its exit; stopped is true when the
// shim was told to stop (p has then been stopped). A fill while p runs
// gets the manifest's on_fill action; for restart, p is stopped and wait
// returns an empty exit.
func (s *shim) wait(p *proc, seen uint64) (exit string, stopped bool) {
	for {
		select {
		case exit := <-p.exited:
			// What the main process left behind goes with it, and is gone
			// before the exit is reported: a restart does not meet the old
			// process's descendants.
			s.stopTree(p)
			s.drained(p)
			return s.exitOf(p, exit), false
		case <-s.stop.Done():
			return s.terminate(p), true
		case <-s.sick:
			s.terminate(p)
			return "unhealthy", false
		case <-s.wake:
			s.mu.Lock()
			// A fill that was written before this process started (by the
			// clock both sides share, else by the count at its start) is
			// one it saw: no action.
			fresh := s.wakes > seen && (s.wokeAt == 0 || s.wokeAt > p.began)
			seen = s.wakes
			s.mu.Unlock()
			if !fresh {
				if s.spec.OnFillRestart || s.spec.OnFillSignal != 0 {
					s.note("a filled file was written before this process started: no on_fill action")
				}
				continue
			}
			switch {
			case s.spec.OnFillRestart:
				s.note("a filled file was written: restarting (on_fill restart)")
				s.terminate(p)
				return "", false
			case s.spec.OnFillSignal != 0:
				sig := syscall.Signal(s.spec.OnFillSignal)
				s.note("a filled file was written: sending %s (on_fill)", unix.SignalName(sig))
				_ = p.proc.Signal(sig)
			}
		}
	}
}

// terminate stops p and its whole tree: the stop signal to every process
// of the module (so each one's handler runs), then SIGKILL to what is
// left after the stop timeout. It returns p's exit.
func (s *shim) terminate(p *proc) string {
	s.stopTree(p)
	exit := s.exitOf(p, <-p.exited)
	s.drained(p)
	return exit
}

// stopTree stops every process of the module's tree (see [tree.stop]).
func (s *shim) stopTree(p *proc) {
	sig := syscall.Signal(s.spec.StopSignal)
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	timeout := s.spec.StopTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	killed, gone := s.tree.stop(sig, timeout)
	if killed {
		s.note("did not stop within %s: SIGKILL", timeout)
	}
	if !gone {
		s.log.Warn("shim: processes of the module outlived SIGKILL", "pid", p.pid)
	}
}

// exitOf is p's exit as a have says it: "oom" when the kernel's OOM
// killer killed a process of the module's cgroup while p ran.
func (s *shim) exitOf(p *proc, exit string) string {
	if s.cg != nil && s.cg.ooms() > p.ooms {
		return "oom"
	}
	return exit
}

// describeStatus says how a process ended: "status N" or "signal NAME".
func describeStatus(ws unix.WaitStatus) string {
	if ws.Signaled() {
		return "signal " + unix.SignalName(ws.Signal())
	}
	return fmt.Sprintf("status %d", ws.ExitStatus())
}
