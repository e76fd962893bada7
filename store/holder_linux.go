package store

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// thisHost is this process's place, read once: the kernel's boot id
// (/proc/sys/kernel/random/boot_id, new at every boot) and its pid
// namespace (/proc/self/ns/pid): a pid names the same process only
// within both. Each is "" when it cannot be read.
var thisHost = sync.OnceValues(func() (boot, pidNS string) {
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		boot = strings.TrimSpace(string(b))
	}
	if ns, err := os.Readlink("/proc/self/ns/pid"); err == nil {
		pidNS = ns
	}
	return boot, pidNS
})

// identify fills h's Boot, PIDNS and Start for this process, leaving
// them empty when /proc does not tell.
func identify(h *Holder) {
	h.Boot, h.PIDNS = thisHost()
	if start, _, err := procStat(os.Getpid()); err == nil {
		h.Start = start
	}
}

// provablyDead reports whether h's process is known to be gone: h was
// recorded on this host (same host name, boot id and pid namespace),
// and its pid is now no process, a zombie, or another process (another
// start time). Anything less certain (another host or boot, a holder
// recorded without its identity, a pid hidden from this user) is not
// proof: the holder may be alive.
func provablyDead(h Holder) bool {
	boot, pidNS := thisHost()
	if boot == "" || pidNS == "" || h.Boot != boot || h.PIDNS != pidNS || h.Host != hostname() || h.PID <= 0 || h.Start == 0 {
		return false
	}
	start, state, err := procStat(h.PID)
	switch {
	case err == nil:
		return start != h.Start || state == 'Z' || state == 'X'
	case errors.Is(err, fs.ErrNotExist):
		// Gone, or hidden by /proc's hidepid: only kill(2) tells.
		return errors.Is(syscall.Kill(h.PID, 0), syscall.ESRCH)
	}
	return false
}

// procStat returns fields 22 (start time, clock ticks since boot) and 3
// (state) of /proc/<pid>/stat.
func procStat(pid int) (start uint64, state byte, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces
	// and parentheses: the fields after it start after the last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, 0, errors.New("/proc/" + strconv.Itoa(pid) + "/stat: no command field")
	}
	f := bytes.Fields(data[i+1:])
	if len(f) < 20 || len(f[0]) == 0 {
		return 0, 0, errors.New("/proc/" + strconv.Itoa(pid) + "/stat: too few fields")
	}
	start, err = strconv.ParseUint(string(f[19]), 10, 64)
	return start, f[0][0], err
}
