package process

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"golang.org/x/sys/unix"
	"gopkg.in/natefinch/lumberjack.v2"

	"github.com/meshfold/meshfold/events"
)

// readyFD is the descriptor a shim reports its first start on (the
// runtime passes a pipe as its first extra file).
const readyFD = 3

// ShimMain runs a shim: the supervisor of one module, whose directory
// (<state dir>/process/<module>) holds its spec.json. The runtime starts
// it as its configured shim command with that directory as the last
// argument; `meshfold shim DIR` calls it. It returns the process's
// exit code: 0 after a stop request or SIGTERM, 2 when the spec is
// unusable.
func ShimMain(dir string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var sp spec
	if err := readJSON(dir, specFile, &sp); err != nil {
		log.Error("shim: read spec", "dir", dir, "err", err)
		return 2
	}
	s := newShim(dir, sp, log.With("module", sp.Module))
	if err := s.run(); err != nil {
		s.log.Error("shim: stopped", "err", err)
		return 2
	}
	return 0
}

// shim supervises one module's process.
type shim struct {
	dir  string
	spec spec
	log  *slog.Logger
	out  *lumberjack.Logger
	self identity

	mu       sync.Mutex
	st       Status
	watchers map[chan Status]struct{}
	wakes    uint64 // fills seen; the loop compares against the count at start
	wokeAt   int64  // the newest fill's time (boottime ns, the agent's clock and ours), 0 if unknown

	replies sync.WaitGroup // stop requests not answered yet

	wake   chan struct{} // 1-buffered: a fill arrived
	stop   context.Context
	cancel context.CancelFunc
	done   chan struct{} // the supervisor loop ended

	// unlisten closes the listener and removes the socket, once. A stop
	// calls it before its reply: the agent starts the next shim of the
	// module (same socket path) only after that reply, so the old shim's
	// cleanup can never delete the new shim's socket.
	unlisten func()
}

func newShim(dir string, sp spec, log *slog.Logger) *shim {
	stop, cancel := context.WithCancel(context.Background())
	return &shim{
		dir:  dir,
		spec: sp,
		log:  log,
		out: &lumberjack.Logger{
			Filename:   filepath.Join(dir, logFile),
			MaxSize:    max(sp.LogMaxMB, 1),
			MaxBackups: max(sp.LogBackups, 1),
		},
		watchers: map[chan Status]struct{}{},
		wake:     make(chan struct{}, 1),
		stop:     stop,
		cancel:   cancel,
		done:     make(chan struct{}),
	}
}

func (s *shim) run() error {
	defer s.out.Close()
	pid := os.Getpid()
	start, err := startTime(pid)
	if err != nil {
		return fmt.Errorf("own start time: %w", err)
	}
	s.self = identity{PID: pid, Start: start}
	s.st = Status{Module: s.spec.Module, Build: s.spec.Build, Account: s.spec.Account, State: events.Stopped,
		Restarts: s.spec.Restarts, Since: time.Now().UTC(), ShimPID: pid, ShimStart: start}
	if err := writeJSON(s.dir, shimFile, s.self); err != nil {
		return fmt.Errorf("write %s: %w", shimFile, err)
	}
	l, err := listenUnix(s.dir, sockFile)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	sock := filepath.Join(s.dir, sockFile)
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

	ready := os.NewFile(readyFD, "ready")
	go s.supervise(ready)
	<-s.done
	// Answer the stop requests before exiting, or the runtime would take
	// the lost reply for a mute shim.
	s.replies.Wait()
	s.log.Info("shim: module stopped; exiting")
	return nil
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
	var req request
	if err := json.NewDecoder(bufio.NewReader(io.LimitReader(c, 4096))).Decode(&req); err != nil {
		return
	}
	enc := json.NewEncoder(c)
	switch req.Op {
	case opStatus:
		_ = enc.Encode(s.status())
	case opWake:
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
	case opStop:
		s.replies.Add(1)
		defer s.replies.Done()
		s.cancel()
		<-s.done
		s.unlisten()
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_ = enc.Encode(s.status())
	case opWatch:
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
	_, _ = fmt.Fprintf(s.out, "meshfold: "+format+"\n", args...)
}

// supervise runs the module until the shim is told to stop: start,
// wait, restart with backoff; a fill ends a backoff at once. The first
// start's outcome is written to ready, which is then closed.
func (s *shim) supervise(ready *os.File) {
	defer close(s.done)
	bo := s.spec.Backoff.withDefaults()
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(bo.Initial),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0),
		backoff.WithMaxInterval(bo.Max),
		backoff.WithMaxElapsedTime(0),
	)
	first := true
	for {
		s.mu.Lock()
		seen := s.wakes
		s.mu.Unlock()
		began := time.Now()
		p, err := s.start()
		if err != nil {
			s.note("start failed: %v", err)
			s.set(func(st *Status) { st.State, st.PID, st.PIDStart, st.Exit = events.Failed, 0, 0, "start: "+err.Error() })
		} else {
			s.set(func(st *Status) { st.State, st.PID, st.PIDStart, st.Backoff = events.Running, p.pid, p.start, 0 })
		}
		if first {
			first = false
			if ready != nil {
				_ = json.NewEncoder(ready).Encode(s.status())
				_ = ready.Close()
			}
		}
		if p != nil {
			exit, stopped := s.wait(p, seen)
			if stopped {
				s.set(func(st *Status) { st.State, st.PID, st.PIDStart, st.Exit, st.Backoff = events.Stopped, 0, 0, exit, 0 })
				return
			}
			if exit == "" { // restarted for a fill (on_fill restart)
				s.set(func(st *Status) { st.Restarts++ })
				continue
			}
			if time.Since(began) >= bo.Reset {
				b.Reset()
			}
			s.set(func(st *Status) { st.State, st.PID, st.PIDStart, st.Exit = events.Failed, 0, 0, exit })
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
			s.set(func(st *Status) { st.State, st.Backoff = events.Stopped, 0 })
			return
		}
		s.set(func(st *Status) { st.Restarts++ })
	}
}

// proc is one started module process.
type proc struct {
	cmd    *exec.Cmd
	pid    int
	start  uint64
	began  int64       // boottime ns taken just before the exec: the process opens any file after it
	exited chan string // the exit description, once the group is killed and the process reaped
}

// start starts the module's command in its own process group, as its
// account, stdout and stderr into the module's log.
func (s *shim) start() (*proc, error) {
	sp := s.spec
	argv0 := sp.Argv[0]
	if !filepath.IsAbs(argv0) {
		argv0 = filepath.Join(sp.Dir, argv0)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv0, sp.Argv[1:]...)
	cmd.Args[0] = sp.Argv[0]
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = sp.Dir, sp.Env, w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if u := sp.User; u != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}
	began := bootNanos()
	err = cmd.Start()
	_ = w.Close()
	if err != nil {
		_ = r.Close()
		return nil, err
	}
	p := &proc{cmd: cmd, pid: cmd.Process.Pid, began: began, exited: make(chan string, 1)}
	p.start, _ = startTime(p.pid)
	if err := writeJSON(s.dir, moduleFile, identity{PID: p.pid, Start: p.start}); err != nil {
		s.log.Warn("shim: module identity not recorded", "err", err)
	}
	go func() { _, _ = io.Copy(s.out, r); _ = r.Close() }()
	go func() {
		// Learn the exit without reaping, so the pid (and the group id)
		// cannot be recycled before the leftovers of the group are killed.
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if !errors.Is(err, unix.EINTR) {
				break
			}
		}
		// What is left of its group goes with it, and is gone before the
		// exit is reported: a stop is complete, and a restart does not
		// meet the old process's descendants.
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		if !waitGroupGone(p.pid, 5*time.Second) {
			s.log.Warn("shim: the module's process group outlived SIGKILL", "pgid", p.pid)
		}
		err := cmd.Wait()
		p.exited <- describeExit(cmd, err)
	}()
	s.log.Info("shim: module started", "pid", p.pid, "build", sp.Build)
	return p, nil
}

// wait waits for p to exit and returns its exit; stopped is true when the
// shim was told to stop (p has then been stopped). A fill while p runs
// gets the manifest's on_fill action; for restart, p is stopped and wait
// returns an empty exit.
func (s *shim) wait(p *proc, seen uint64) (exit string, stopped bool) {
	for {
		select {
		case exit := <-p.exited:
			return exit, false
		case <-s.stop.Done():
			return s.terminate(p), true
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
				_ = p.cmd.Process.Signal(sig)
			}
		}
	}
}

// terminate stops p: the stop signal to its process group, then SIGKILL
// to the group after the stop timeout. It returns p's exit.
func (s *shim) terminate(p *proc) string {
	sig := syscall.Signal(s.spec.StopSignal)
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	_ = syscall.Kill(-p.pid, sig)
	timeout := s.spec.StopTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case exit := <-p.exited:
		return exit
	case <-t.C:
		s.note("did not stop within %s: SIGKILL", timeout)
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		return <-p.exited
	}
}

// describeExit says how a process ended: "status N" or "signal NAME".
func describeExit(cmd *exec.Cmd, err error) string {
	ps := cmd.ProcessState
	if ps == nil {
		if err != nil {
			return "wait: " + err.Error()
		}
		return "unknown"
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "signal " + unix.SignalName(ws.Signal())
	}
	return fmt.Sprintf("status %d", ps.ExitCode())
}
