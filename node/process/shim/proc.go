package shim

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// StartTime returns field 22 of /proc/<pid>/stat: the process's start time
// in clock ticks since boot. With the pid it identifies a process: a pid
// the kernel recycled has another start time.
//
// Errors: the process does not exist (matching fs.ErrNotExist), or the file
// cannot be parsed.
func StartTime(pid int) (uint64, error) {
	if pid <= 0 {
		return 0, fmt.Errorf("pid %d: %w", pid, os.ErrNotExist)
	}
	f, err := statFields(strconv.Itoa(pid))
	if err != nil {
		return 0, err
	}
	// f[0] is field 3 (state); field 22 is f[19].
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	if f[0][0] == 'Z' || f[0][0] == 'X' {
		return 0, fmt.Errorf("pid %d: a zombie: %w", pid, os.ErrNotExist)
	}
	return strconv.ParseUint(string(f[19]), 10, 64)
}

// statFields returns the fields of /proc/<pid>/stat from the third (the
// state) on: f[0] is field 3, f[k] field k+3. The command name (field 2)
// is in parentheses and may hold spaces and parentheses itself: the fields
// after it start after the last ')'.
func statFields(pid string) ([][]byte, error) {
	data, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%s/stat: no command field", pid)
	}
	return bytes.Fields(data[i+1:]), nil
}

// Alive reports whether pid is the process that started at start.
func Alive(pid int, start uint64) bool {
	st, err := StartTime(pid)
	return err == nil && st == start
}

// Account is a Unix user resolved from the user database.
type Account struct {
	Name   string   `json:"name"`
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
	Home   string   `json:"home,omitempty"`
}

// maxSocketPath is the longest path a unix socket address holds on Linux
// (sun_path is 108 bytes, NUL included).
const maxSocketPath = 107

// listenBacklog is a shim's socket's backlog: one agent connects to it,
// a few connections at a time.
const listenBacklog = 64

// socketAddr returns an address for the unix socket dir/name. A path too
// long for sun_path goes through the directory's descriptor
// (/proc/self/fd/N/name); the returned closer releases it once the
// socket is bound or connected.
func socketAddr(dir, name string) (addr string, closer func(), err error) {
	p := filepath.Join(dir, name)
	if len(p) <= maxSocketPath {
		return p, func() {}, nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return "", nil, err
	}
	return "/proc/self/fd/" + strconv.Itoa(int(d.Fd())) + "/" + name, func() { _ = d.Close() }, nil
}

// ListenUnix listens on the unix socket dir/name, replacing a stale one.
func ListenUnix(dir, name string) (*net.UnixListener, error) {
	_ = os.Remove(filepath.Join(dir, name))
	addr, done, err := socketAddr(dir, name)
	if err != nil {
		return nil, err
	}
	defer done()
	// The socket is made by hand and handed to net: net.ListenUnix reads
	// the kernel's backlog limit through a 64 kB buffer that a shim would
	// keep for its life (issue 27's memory per shim).
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: "unix", Err: os.NewSyscallError("socket", err)}
	}
	f := os.NewFile(uintptr(fd), addr)
	defer f.Close()
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: addr}); err != nil {
		return nil, &net.OpError{Op: "listen", Net: "unix", Addr: &net.UnixAddr{Name: addr, Net: "unix"}, Err: os.NewSyscallError("bind", err)}
	}
	if err := unix.Listen(fd, listenBacklog); err != nil {
		return nil, &net.OpError{Op: "listen", Net: "unix", Addr: &net.UnixAddr{Name: addr, Net: "unix"}, Err: os.NewSyscallError("listen", err)}
	}
	fl, err := net.FileListener(f)
	if err != nil {
		return nil, err
	}
	l := fl.(*net.UnixListener)
	// The socket's own path would be the /proc one: unlink by real path.
	l.SetUnlinkOnClose(false)
	return l, nil
}

// DialUnix connects to the unix socket dir/name.
func DialUnix(dir, name string) (*net.UnixConn, error) {
	addr, done, err := socketAddr(dir, name)
	if err != nil {
		return nil, err
	}
	defer done()
	return net.DialUnix("unix", nil, &net.UnixAddr{Name: addr, Net: "unix"})
}

// PeerPID returns the pid of the process at the other end of c
// (SO_PEERCRED: the process that created the listening socket).
func PeerPID(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *syscall.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, serr
	}
	return int(cred.Pid), nil
}

// WaitExit waits up to timeout for pid to exit, on a pidfd (which works
// for a process that is not this one's child). It reports whether the
// process is gone.
func WaitExit(pid int, timeout time.Duration) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return errors.Is(err, unix.ESRCH)
	}
	defer unix.Close(fd)
	end := time.Now().Add(timeout)
	for {
		ms := int(time.Until(end) / time.Millisecond)
		if ms <= 0 {
			return false
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, ms)
		if err == nil && n > 0 {
			return true
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			return false
		}
	}
}

// groupAlive reports whether a process other than a zombie is in process
// group pgid (field 5 of /proc/<pid>/stat).
func groupAlive(pgid int) bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	want := []byte(strconv.Itoa(pgid))
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		f, err := statFields(e.Name())
		if err != nil {
			continue
		}
		// f[0] is the state (field 3), f[2] the process group (field 5).
		if len(f) > 2 && f[0][0] != 'Z' && f[0][0] != 'X' && bytes.Equal(f[2], want) {
			return true
		}
	}
	return false
}

// waitGroupGone waits up to timeout for every process of group pgid to
// exit, looking every few milliseconds: there is no descriptor to wait on
// for processes that are not this one's children.
func waitGroupGone(pgid int, timeout time.Duration) bool {
	end := time.Now().Add(timeout)
	for groupAlive(pgid) {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// BootNanos is CLOCK_BOOTTIME in nanoseconds: monotonic, and the same in
// every process of the host (the agent stamps a fill with it, the shim a
// start).
func BootNanos() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}
