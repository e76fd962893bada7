package shim

import (
	"bytes"
	"errors"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshfold/meshfold/node/bundle/runspec"
)

// reaper reaps every child of the shim: the module's processes it started
// and, the shim being a child subreaper (PR_SET_CHILD_SUBREAPER), every
// descendant orphaned below it (a daemon's double fork, a shell's
// children). The exits of the processes the shim started are handed to
// their waiters; the others are only reaped, so no zombie accumulates.
type reaper struct {
	mu      sync.Mutex
	waiting map[int]chan unix.WaitStatus
}

// newReaper makes the calling process a child subreaper and starts
// reaping on every SIGCHLD.
//
// Errors: prctl refused (a kernel before 3.4).
func newReaper() (*reaper, error) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, err
	}
	r := &reaper{waiting: map[int]chan unix.WaitStatus{}}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	go func() {
		for range sigs {
			r.reap()
		}
	}()
	return r, nil
}

// reap reaps every child that has exited.
func (r *reaper) reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		// spawn holds mu from the fork to the registration: a child that
		// exits at once is found here.
		r.mu.Lock()
		ch := r.waiting[pid]
		delete(r.waiting, pid)
		r.mu.Unlock()
		if ch != nil {
			ch <- ws
		}
	}
}

// spawn runs start (one fork) and returns the child and the channel its
// wait status arrives on once it is reaped.
func (r *reaper) spawn(start func() (*os.Process, error)) (*os.Process, <-chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, err := start()
	if err != nil {
		return nil, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	r.waiting[p.Pid] = ch
	return p, ch, nil
}

// member is one process of a module's tree, as /proc showed it.
type member struct {
	pid   int
	start uint64
}

// tree is a module's whole tree: its cgroup's processes, or, where no
// cgroup could be made, every descendant of the shim (the subreaper
// brings every orphan of the module back below it).
type tree struct {
	cg modCgroup // nil: walk the shim's descendants
}

// members lists the tree's live processes (zombies excluded: they are
// reaped, not signalled).
func (t tree) members() []member {
	if t.cg != nil {
		pids, err := t.cg.pids()
		if err == nil {
			out := make([]member, 0, len(pids))
			for _, pid := range pids {
				if st, err := StartTime(pid); err == nil {
					out = append(out, member{pid, st})
				}
			}
			return out
		}
	}
	return descendants(os.Getpid())
}

// signal sends sig to every member, through a pidfd opened after checking
// its start time, so a pid recycled meanwhile is never signalled. It
// returns how many were signalled.
func (t tree) signal(sig syscall.Signal) int {
	return signalMembers(t.members(), sig)
}

// signalMembers sends sig to each of ms that still has its start time
// (see [tree.signal]); it returns how many were signalled.
func signalMembers(ms []member, sig syscall.Signal) int {
	n := 0
	for _, m := range ms {
		fd, err := unix.PidfdOpen(m.pid, 0)
		if err != nil {
			continue
		}
		if Alive(m.pid, m.start) && unix.PidfdSendSignal(fd, sig, nil, 0) == nil {
			n++
		}
		_ = unix.Close(fd)
	}
	return n
}

// treePoll is how often a stop looks whether the tree is gone: processes
// that are not the shim's children give no event to wait on.
const treePoll = 10 * time.Millisecond

// waitEmpty waits up to timeout for the tree to have no live process, and
// reports whether it is empty.
func (t tree) waitEmpty(timeout time.Duration) bool {
	end := time.Now().Add(timeout)
	for len(t.members()) > 0 {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(treePoll)
	}
	return true
}

// stop ends the whole tree: sig to every process (each one's handler may
// run), up to timeout for all of them to exit, then SIGKILL, again and
// again (a fork racing the kill is killed the next round), until none is
// left or killWait passed. It reports whether SIGKILL was needed and
// whether the tree is gone.
func (t tree) stop(sig syscall.Signal, timeout time.Duration) (killed, gone bool) {
	if sig != 0 && t.signal(sig) > 0 && t.waitEmpty(timeout) {
		return false, true
	}
	if len(t.members()) == 0 {
		return false, true
	}
	end := time.Now().Add(killWait)
	for {
		t.signal(syscall.SIGKILL)
		if t.waitEmpty(100 * time.Millisecond) {
			return true, true
		}
		if time.Now().After(end) {
			return true, false
		}
	}
}

// killWait bounds how long a stop keeps killing a tree that will not go
// (a process in uninterruptible sleep).
const killWait = 10 * time.Second

// descendants walks /proc for every live process below pid.
func descendants(root int) []member {
	procs, children := procTable()
	var out []member
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, member{c, procs[c].start})
			queue = append(queue, c)
		}
	}
	return out
}

// everyProcess lists every live process in /proc, wherever it hangs in
// the tree. A walk from pid 1 can miss a process whose parent is exiting
// as /proc is read: its own line still names the parent, whose line,
// read a moment later, is already a zombie's and left out (the children
// of a shim killed while its socket's end is seen, as KillByEnv's are).
func everyProcess() []member {
	procs, _ := procTable()
	out := make([]member, 0, len(procs))
	for pid, p := range procs {
		out = append(out, member{pid, p.start})
	}
	return out
}

// procInfo is what procTable reads of a process.
type procInfo struct {
	ppid  int
	start uint64
}

// procTable reads every live process of /proc (zombies left out): its
// parent and start time, and each parent's children.
func procTable() (map[int]procInfo, map[int][]int) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, nil
	}
	procs := make(map[int]procInfo, len(ents))
	children := map[int][]int{}
	for _, e := range ents {
		name := e.Name()
		if name[0] < '0' || name[0] > '9' {
			continue
		}
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		f, err := statFields(name)
		if err != nil {
			continue
		}
		// f[0] is the state (field 3), f[1] the parent (field 4), f[19]
		// the start time (field 22).
		if len(f) < 20 || f[0][0] == 'Z' || f[0][0] == 'X' {
			continue
		}
		ppid, _ := strconv.Atoi(string(f[1]))
		start, _ := strconv.ParseUint(string(f[19]), 10, 64)
		procs[pid] = procInfo{ppid, start}
		children[ppid] = append(children[ppid], pid)
	}
	return procs, children
}

// KillCgroup SIGKILLs every process left in the module cgroup name under
// parent (the leftovers of a shim that died) and removes the cgroup. It
// returns false when processes outlived SIGKILL; a cgroup that cannot be
// opened or made is an error, and nothing is killed.
func KillCgroup(parent, name string) (gone bool, err error) {
	cg, err := newCgroup(parent, name, runspec.Limits{})
	if err != nil {
		return false, err
	}
	_, gone = (tree{cg: cg}).stop(0, 0)
	_ = cg.remove()
	return gone, nil
}

// KillByEnv SIGKILLs, until none is left (10 s at most), every process
// whose environment holds every one of env ("NAME=value"): the
// descendants of a module whose shim died, where no cgroup holds them. A
// process that rewrote its environment escapes it. It returns how many
// it found at most at once.
func KillByEnv(env []string) int {
	want := make([][]byte, len(env))
	for i, e := range env {
		want[i] = []byte(e)
	}
	found := 0
	end := time.Now().Add(killWait)
	for time.Now().Before(end) {
		var ms []member
		for _, m := range everyProcess() {
			data, err := os.ReadFile("/proc/" + strconv.Itoa(m.pid) + "/environ")
			if err != nil {
				continue
			}
			vars := bytes.Split(data, []byte{0})
			if !slices.ContainsFunc(want, func(w []byte) bool {
				return !slices.ContainsFunc(vars, func(v []byte) bool { return bytes.Equal(v, w) })
			}) {
				ms = append(ms, m)
			}
		}
		if len(ms) == 0 {
			break
		}
		found = max(found, len(ms))
		signalMembers(ms, syscall.SIGKILL)
		time.Sleep(treePoll)
	}
	return found
}
