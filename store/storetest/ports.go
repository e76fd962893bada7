package storetest

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// A server whose port the test must know before it starts (a route that
// every other server is configured with, a process restarted on the same
// port) binds it itself, after the test picked it. A port picked by
// listening on :0 and closing the listener is one the kernel hands out
// again to any bind(0) or outgoing connection in between, of this process
// or any other: the server's bind then fails, and a nats-server started
// without a logger (NoLog) says nothing: its route listener is missing and
// ReadyForConnections times out (TestReconcileGroupOnCluster: "cluster
// server m2 not ready" after 10 s, at load 1.6). freePorts picks ports
// below the kernel's ephemeral range, which it never hands out, and
// reserves each against every other test process on the machine with a
// lock on its byte of one lock file, held until the test ends.

// portLocks is this process's side of the reservations: the lock file,
// opened once and never closed (closing any descriptor of it would drop
// every lock of the process), and the ports this process holds (a
// process's own record locks never conflict with each other).
var portLocks struct {
	once sync.Once
	f    *os.File
	err  error

	mu   sync.Mutex
	held map[int]bool
}

// portRange is where freePorts picks: [20000, the ephemeral range's
// start), the start read from /proc/sys/net/ipv4/ip_local_port_range
// (32768 where it is not readable: Linux's default, below the BSDs').
func portRange() (lo, hi int, err error) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				hi = v
			}
		}
	}
	lo = 20000
	if hi-lo < 1000 {
		lo = 10000
	}
	if hi-lo < 1000 {
		return 0, 0, fmt.Errorf("no port range below the ephemeral ports (from %d)", hi)
	}
	return lo, hi, nil
}

// freePorts reserves n loopback TCP ports for the test: below the
// kernel's ephemeral range, locked against every other process that
// reserves them this way, and free when picked (a listen on each
// succeeded and was closed). They stay reserved until the test's cleanup,
// so a server stopped and started again gets its port back.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	portLocks.once.Do(func() {
		path := filepath.Join(os.TempDir(), "meshfold-storetest-ports.lock")
		portLocks.f, portLocks.err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
		if portLocks.err == nil {
			_ = portLocks.f.Chmod(0o666) // other users' tests reserve here too (where it is ours to change)
		}
		portLocks.held = map[int]bool{}
	})
	if portLocks.err != nil {
		t.Fatalf("storetest: port lock file: %v", portLocks.err)
	}
	lo, hi, err := portRange()
	if err != nil {
		t.Fatalf("storetest: free port: %v", err)
	}
	var ports []int
	t.Cleanup(func() {
		for _, p := range ports {
			releasePort(p)
		}
	})
	start := lo + rand.IntN(hi-lo)
	for i := 0; len(ports) < n; i++ {
		if i == hi-lo {
			t.Fatalf("storetest: free port: none of %d–%d free", lo, hi-1)
		}
		p := lo + (start-lo+i)%(hi-lo)
		ok, err := reservePort(p)
		if err != nil {
			t.Fatalf("storetest: free port: %v", err)
		}
		if ok {
			ports = append(ports, p)
		}
	}
	return ports
}

// reservePort takes port p when no process holds it and a listen on it
// succeeds.
func reservePort(p int) (bool, error) {
	portLocks.mu.Lock()
	defer portLocks.mu.Unlock()
	if portLocks.held[p] {
		return false, nil
	}
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: io.SeekStart, Start: int64(p), Len: 1}
	if err := syscall.FcntlFlock(portLocks.f.Fd(), syscall.F_SETLK, &lk); err != nil {
		if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EACCES) {
			return false, nil // another process's
		}
		return false, fmt.Errorf("lock port %d: %w", p, err)
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
	if err != nil {
		unlockPort(p) // bound by something that does not reserve
		return false, nil
	}
	ln.Close()
	portLocks.held[p] = true
	return true, nil
}

func releasePort(p int) {
	portLocks.mu.Lock()
	defer portLocks.mu.Unlock()
	delete(portLocks.held, p)
	unlockPort(p)
}

func unlockPort(p int) {
	lk := syscall.Flock_t{Type: syscall.F_UNLCK, Whence: io.SeekStart, Start: int64(p), Len: 1}
	_ = syscall.FcntlFlock(portLocks.f.Fd(), syscall.F_SETLK, &lk)
}

// FreePort reserves a loopback TCP port for the test, as the clusters'
// route ports are (freePorts): below the kernel's ephemeral range, so
// that no bind(0) and no outgoing connection takes it between the test
// picking it and a server binding it, nor while a server the test
// restarts on it is down; and held against every other test process
// until the test ends. For a server given an address to listen on
// (`meshfold serve --listen`), or one that must not be listened on.
func FreePort(t testing.TB) int {
	t.Helper()
	return freePorts(t, 1)[0]
}

// FreeAddr is [FreePort] as "127.0.0.1:PORT".
func FreeAddr(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", FreePort(t))
}
