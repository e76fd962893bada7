package shim

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node/bundle/runspec"
)

// Health checks run in the shim (DESIGN.md §11 "Health"), so they go on
// while the agent restarts. Each run of the module gets its own checker:
// health is starting until a check passes (healthy); after the grace,
// failures consecutive failures make it unhealthy, and with restart the
// module is then stopped and restarted through the crash backoff. A pass
// makes an unhealthy module healthy again.
//
// The notify kind is the systemd notify protocol: the shim owns a datagram
// socket in the abstract namespace, named in the module's NOTIFY_SOCKET,
// and takes a message only from a process of the module's tree (its
// SCM_CREDENTIALS pid). READY=1 is the pass; with an interval,
// WATCHDOG_USEC is set and each interval without WATCHDOG=1 after READY is
// a failure; STOPPING=1 ends the checking of that run.

// notifyName is the abstract socket name of the module whose directory is
// dir ("@" marks the abstract namespace in NOTIFY_SOCKET, as systemd
// reads it).
func notifyName(module, dir string) string {
	return "@meshfold/notify/" + pathName(module, dir)
}

// NotifyEnv is what a module with a notify check finds in its environment.
func NotifyEnv(module, dir string, h *runspec.Health) []string {
	if h == nil || !h.Notify {
		return nil
	}
	env := []string{"NOTIFY_SOCKET=" + notifyName(module, dir)}
	if interval, _, _ := h.Durations(); interval > 0 {
		env = append(env, "WATCHDOG_USEC="+strconv.FormatInt(interval.Microseconds(), 10))
	}
	return env
}

// listenNotify opens the module's notify socket and passes every message
// a process of the module sends to s.notes.
func (s *shim) listenNotify() error {
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyName(s.spec.Module, s.dir), Net: "unixgram"})
	if err != nil {
		return err
	}
	raw, err := c.SyscallConn()
	if err != nil {
		_ = c.Close()
		return err
	}
	var serr error
	_ = raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1) })
	if serr != nil {
		_ = c.Close()
		return serr
	}
	go func() {
		<-s.stop.Done()
		<-s.done
		_ = c.Close()
	}()
	go func() {
		buf := make([]byte, 4096)
		oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred))
		for {
			n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			pid := senderPID(oob[:oobn])
			if pid == 0 || !slices.ContainsFunc(s.tree.members(), func(m member) bool { return m.pid == pid }) {
				continue // not a process of the module
			}
			select {
			case s.notes <- bytes.Clone(buf[:n]):
			default: // a flood: the checker reads what it can
			}
		}
	}()
	return nil
}

// senderPID is the pid in a message's SCM_CREDENTIALS, 0 if none.
func senderPID(oob []byte) int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for _, m := range msgs {
		if cred, err := unix.ParseUnixCredentials(&m); err == nil {
			return int(cred.Pid)
		}
	}
	return 0
}

// checker judges one run of the module.
type checker struct {
	s        *shim
	h        runspec.Health
	interval time.Duration
	timeout  time.Duration
	grace    time.Duration
	failures int
	started  time.Time
	fails    int
}

// check runs the module's check for run p until ctx ends. With restart,
// it sends on sick once the module is unhealthy, and ends.
func (s *shim) check(ctx context.Context, p *proc, sick chan<- struct{}) {
	h := *s.spec.Health
	c := &checker{s: s, h: h, failures: h.FailuresOrDefault(), started: time.Now()}
	c.interval, c.timeout, c.grace = h.Durations()
	s.set(func(st *Status) { st.Health = events.HealthStarting })
	if h.Notify {
		c.notify(ctx, sick)
		return
	}
	t := time.NewTimer(0) // the first try at once
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := c.probe(ctx, p)
		if ctx.Err() != nil {
			return
		}
		if c.judge(err, sick) {
			return
		}
		t.Reset(c.interval)
	}
}

// judge records one try's outcome; it reports whether the checking ends
// (the module is unhealthy and is to be restarted).
func (c *checker) judge(err error, sick chan<- struct{}) bool {
	s := c.s
	if err == nil {
		c.fails = 0
		if s.status().Health != events.Healthy {
			s.set(func(st *Status) { st.Health = events.Healthy })
			s.note("healthy (%s check)", c.h.Kind())
		}
		return false
	}
	if time.Since(c.started) < c.grace {
		return false
	}
	c.fails++
	if c.fails < c.failures || s.status().Health == events.Unhealthy {
		return false
	}
	s.set(func(st *Status) { st.Health = events.Unhealthy })
	if !c.h.Restart {
		s.note("unhealthy after %d failed %s checks: %v", c.fails, c.h.Kind(), err)
		return false
	}
	s.note("unhealthy after %d failed %s checks: %v; restarting", c.fails, c.h.Kind(), err)
	select {
	case sick <- struct{}{}:
	default:
	}
	return true
}

// probe runs one try of an exec, http or tcp check.
func (c *checker) probe(ctx context.Context, p *proc) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	switch {
	case len(c.h.Exec) > 0:
		return c.exec(ctx)
	case c.h.HTTP != "":
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.h.HTTP, nil)
		if err != nil {
			return err
		}
		resp, err := healthClient.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode > 299 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	case c.h.TCP != "":
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", c.h.TCP)
		if err != nil {
			return err
		}
		return conn.Close()
	}
	return nil
}

// healthClient makes each http check a fresh connection (a check that
// reuses one does not see a server that stopped accepting), uses no proxy,
// and follows no redirect (a 3xx is not a pass). An https check does not
// verify the module's certificate, as the kubelet's probes do not: it asks
// whether the module answers, and a module's certificate is often one no
// CA of the node signed (a private CA, a filled file).
var healthClient = &http.Client{
	Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // a health probe, not a trust decision
	CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	},
}

// exec runs the exec check as the module runs: its account, its cgroup,
// its environment, the bundle as working directory, in a process group of
// its own that a timeout kills.
func (c *checker) exec(ctx context.Context) error {
	sp := c.s.spec
	argv0 := c.h.Exec[0]
	if !filepath.IsAbs(argv0) {
		argv0 = filepath.Join(sp.Dir, argv0)
	}
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer null.Close()
	// Its output, stdout and stderr together, for the note of a fall
	// (checkoutput.go): bounded, never a declared file's content.
	pr0, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	attr := &os.ProcAttr{Dir: sp.Dir, Env: sp.Env, Files: []*os.File{null, pw, pw}, Sys: c.s.sysAttr()}
	pr, ws, err := c.s.spawn(attr, argv0, c.h.Exec)
	_ = pw.Close()
	exited := make(chan struct{})
	output := capture(pr0, exited)
	said := func(e error) error {
		close(exited)
		out, cut := output()
		return fmt.Errorf("%w%s", e, outputText(out, cut, c.s.declaredFiles()))
	}
	if err != nil {
		close(exited)
		output()
		return startError(err, sp.Dir)
	}
	defer pr.Release()
	select {
	case st := <-ws:
		if st.Exited() && st.ExitStatus() == 0 {
			close(exited)
			output()
			return nil
		}
		return said(fmt.Errorf("exec: %s", describeStatus(st)))
	case <-ctx.Done():
		// Not reaped yet, so the group's id is still its own.
		_ = syscall.Kill(-pr.Pid, syscall.SIGKILL)
		<-ws
		return said(fmt.Errorf("exec: timed out after %s", c.timeout))
	}
}

// notify judges a run by the module's notify messages.
func (c *checker) notify(ctx context.Context, sick chan<- struct{}) {
	s := c.s
	tick := c.interval
	if tick <= 0 {
		tick = runspec.DefaultHealthInterval // no watchdog: only READY is awaited
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	ready, pinged, stopping := false, false, false
	for {
		select {
		case <-ctx.Done():
			return
		case msg := <-s.notes:
			for _, l := range bytes.Split(msg, []byte("\n")) {
				switch string(l) {
				case "READY=1":
					if !ready {
						ready, pinged = true, true
						t.Reset(tick)
						c.judge(nil, sick)
					}
				case "WATCHDOG=1":
					pinged = true
					if ready && s.status().Health == events.Unhealthy {
						c.judge(nil, sick)
					}
				case "STOPPING=1":
					stopping = true
					s.note("the module says it is stopping (STOPPING=1)")
				}
			}
		case <-t.C:
			if stopping {
				continue
			}
			var err error
			switch {
			case !ready:
				err = fmt.Errorf("no READY=1")
			case c.interval > 0 && !pinged:
				err = fmt.Errorf("no WATCHDOG=1 within %s", c.interval)
			}
			pinged = false
			if err != nil && c.judge(err, sick) {
				return
			}
		}
	}
}
