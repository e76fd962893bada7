package shim

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/meshfold/meshfold/node/bundle/runspec"
)

// DefaultCgroupParent is the cgroup under which each module gets its own
// (DESIGN.md §8), at the root of every hierarchy, as Nomad keeps its
// tasks under nomad/ (v1) or nomad.slice (v2).
const DefaultCgroupParent = "meshfold"

// v1Controllers are the cgroup v1 hierarchies a module's cgroup is made
// in: its limits (memory, cpu, pids) and its freezer. Where one is not
// mounted the others still serve.
var v1Controllers = []cgroup1.Name{cgroup1.Memory, cgroup1.Cpu, cgroup1.Pids, cgroup1.Freezer}

// cgroupV2Root is where the unified hierarchy is mounted.
const cgroupV2Root = "/sys/fs/cgroup"

// modCgroup is one module's cgroup: how its processes are started in it,
// found, counted as OOM-killed, and how it is removed.
type modCgroup interface {
	// spawn runs start, which forks once, so that the child is born in
	// the cgroup (no moment outside it in which it could fork).
	spawn(attr *syscall.SysProcAttr, start func() (*os.Process, error)) (*os.Process, error)
	// pids lists the processes in the cgroup.
	pids() ([]int, error)
	// ooms is how many processes the kernel's OOM killer killed in it.
	ooms() uint64
	// remove deletes the (empty) cgroup.
	remove() error
}

// CgroupName is the name of the cgroup of the module whose directory is
// dir: the module's name and a hash of the directory and of the random id
// in its [InstanceFile], so two agents on a host (two state directories)
// never share one, nor do two shims of one path (a state directory wiped
// or moved while its shims ran, then made again: a fresh user's finding
// U33), and a shim that replaces a lost one in the same directory finds
// its predecessor's. A directory without the file (made before it
// existed) is named by its path alone.
func CgroupName(module, dir string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(dir))
	if id, err := os.ReadFile(filepath.Join(dir, InstanceFile)); err == nil {
		_, _ = h.Write([]byte{0})
		_, _ = h.Write(id)
	}
	return fmt.Sprintf("%s-%012x", module, h.Sum64()&0xffffffffffff)
}

// pathName is module's name and a hash of its directory alone: the notify
// socket's name, which is in the module's spec (its environment) and so
// must not change under a running shim.
func pathName(module, dir string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(dir))
	return fmt.Sprintf("%s-%012x", module, h.Sum64()&0xffffffffffff)
}

// InstanceFile, in a module's directory, holds the random id that tells
// its cgroup from that of any other directory once at the same path.
const InstanceFile = "instance"

// EnsureInstance gives dir its [InstanceFile] unless it has one: the
// runtime calls it before every shim it starts there.
func EnsureInstance(dir string) error {
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, InstanceFile), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = f.WriteString(hex.EncodeToString(id[:]) + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// resources maps a manifest's limits to the OCI resources the cgroup
// library takes: memory in bytes, CPU as a CFS quota per 100 ms period,
// pids as a count.
func resources(l runspec.Limits) *specs.LinuxResources {
	res := &specs.LinuxResources{}
	if l.Memory > 0 {
		m := l.Memory
		res.Memory = &specs.LinuxMemory{Limit: &m}
	}
	if l.CPU > 0 {
		period := uint64(100_000)
		quota := int64(l.CPU * float64(period))
		res.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
	}
	if l.Pids > 0 {
		p := l.Pids
		res.Pids = &specs.LinuxPids{Limit: &p}
	}
	return res
}

// newCgroup makes (or takes over) the cgroup parent/name with l's limits,
// v1 or v2 as the host has them.
//
// Errors: the host has no cgroup hierarchy this can use, or the cgroup
// cannot be made (not root, a read-only cgroupfs, a container's root
// cgroup that holds processes).
func newCgroup(parent, name string, l runspec.Limits) (modCgroup, error) {
	path := "/" + filepath.Join(parent, name)
	switch cgroups.Mode() {
	case cgroups.Unified:
		m, err := cgroup2.NewManager(cgroupV2Root, path, cgroup2.ToResources(resources(l)))
		if err != nil {
			return nil, fmt.Errorf("cgroup v2 %s: %w", path, err)
		}
		remake := func() error {
			_, err := cgroup2.NewManager(cgroupV2Root, path, cgroup2.ToResources(resources(l)))
			return err
		}
		return &cgroupV2{m: m, dir: filepath.Join(cgroupV2Root, path), remake: remake}, nil
	case cgroups.Legacy, cgroups.Hybrid:
		cg, err := cgroup1.New(cgroup1.StaticPath(path), resources(l),
			cgroup1.WithHierarchy(v1Hierarchy), allowAny)
		if err != nil {
			return nil, fmt.Errorf("cgroup v1 %s: %w", path, err)
		}
		subs := cg.Subsystems()
		if len(subs) == 0 {
			return nil, fmt.Errorf("cgroup v1 %s: none of the hierarchies %v is mounted", path, v1Controllers)
		}
		own, err := cgroup1.Load(cgroup1.PidPath(os.Getpid()), cgroup1.WithHierarchy(v1Hierarchy), allowAny)
		if err != nil {
			return nil, fmt.Errorf("cgroup v1: the shim's own cgroup: %w", err)
		}
		remake := func() error {
			_, err := cgroup1.New(cgroup1.StaticPath(path), resources(l), cgroup1.WithHierarchy(v1Hierarchy), allowAny)
			return err
		}
		return &cgroupV1{cg: cg, own: own, by: subs[0].Name(), remake: remake}, nil
	}
	return nil, errors.New("no cgroup hierarchy is mounted")
}

// allowAny makes a hierarchy that cannot be used skipped rather than
// fatal (the library requires the devices one by default).
func allowAny(c *cgroup1.InitConfig) error {
	c.InitCheck = cgroup1.AllowAny
	return nil
}

// v1Hierarchy is cgroup1.Default filtered to v1Controllers.
func v1Hierarchy() ([]cgroup1.Subsystem, error) {
	all, err := cgroup1.Default()
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(s cgroup1.Subsystem) bool { return !slices.Contains(v1Controllers, s.Name()) }), nil
}

// cgroupV1 is a module's cgroup in the v1 hierarchies.
type cgroupV1 struct {
	cg  cgroup1.Cgroup
	own cgroup1.Cgroup // the shim's own cgroup, where the forking thread goes back
	by  cgroup1.Name   // the hierarchy its processes are listed from
	// remake makes the cgroup's directories again, with its limits, at
	// the same path (cg keeps working on them).
	remake func() error
}

// spawn forks from a thread of its own that it first moves into the
// cgroup (v1 places threads, and a child is born in its parent thread's
// cgroups), then moves back. Should the move back fail, the thread is
// never used again: its goroutine stays locked to it until the child has
// exited, then ends, and Go ends the thread (not before: the kernel sends
// the child its parent-death signal when the thread that forked it ends).
func (c *cgroupV1) spawn(_ *syscall.SysProcAttr, start func() (*os.Process, error)) (*os.Process, error) {
	type result struct {
		p   *os.Process
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		tid := cgroup1.Process{Pid: unix.Gettid()}
		err := c.cg.AddTask(tid)
		if errors.Is(err, fs.ErrNotExist) {
			// The cgroup was removed under the shim (by hand, or by
			// another shim before cgroups were named per instance): a
			// start makes it again rather than fail until the module's
			// want changes (a fresh user's finding U33).
			if rerr := c.remake(); rerr == nil {
				err = c.cg.AddTask(tid)
			}
		}
		if err != nil {
			_ = c.own.AddTask(tid)
			ch <- result{nil, fmt.Errorf("join the module's cgroup: %w", err)}
			return
		}
		p, err := start()
		ch <- result{p, err}
		if c.own.AddTask(tid) == nil {
			runtime.UnlockOSThread()
			return
		}
		if err == nil {
			for !WaitExit(p.Pid, time.Hour) {
				time.Sleep(time.Second) // no pidfd to wait on: look again
			}
		}
	}()
	r := <-ch
	return r.p, r.err
}

func (c *cgroupV1) pids() ([]int, error) {
	ps, err := c.cg.Processes(c.by, true)
	if err != nil {
		return nil, err
	}
	self := os.Getpid() // listed while its forking thread is in the cgroup
	out := make([]int, 0, len(ps))
	for _, p := range ps {
		if p.Pid != self {
			out = append(out, p.Pid)
		}
	}
	return out, nil
}

func (c *cgroupV1) ooms() uint64 {
	m, err := c.cg.Stat(cgroup1.IgnoreNotExist)
	if err != nil || m.MemoryOomControl == nil {
		return 0
	}
	return m.MemoryOomControl.OomKill
}

func (c *cgroupV1) remove() error { return c.cg.Delete() }

// cgroupV2 is a module's cgroup in the unified hierarchy.
type cgroupV2 struct {
	m      *cgroup2.Manager
	dir    string
	remake func() error // makes the cgroup again at dir, with its limits
}

// spawn starts the child in the cgroup with clone3's CLONE_INTO_CGROUP.
func (c *cgroupV2) spawn(attr *syscall.SysProcAttr, start func() (*os.Process, error)) (*os.Process, error) {
	fd, err := unix.Open(c.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) && c.remake() == nil {
		// Removed under the shim: made again (see cgroupV1.spawn).
		fd, err = unix.Open(c.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("open the module's cgroup: %w", err)
	}
	defer unix.Close(fd)
	attr.UseCgroupFD, attr.CgroupFD = true, fd
	return start()
}

func (c *cgroupV2) pids() ([]int, error) {
	ps, err := c.m.Procs(true)
	if err != nil {
		return nil, err
	}
	out := make([]int, 0, len(ps))
	for _, p := range ps {
		out = append(out, int(p))
	}
	return out, nil
}

func (c *cgroupV2) ooms() uint64 {
	m, err := c.m.StatFiltered(cgroup2.StatMemoryEvents)
	if err != nil || m.MemoryEvents == nil {
		return 0
	}
	return m.MemoryEvents.OomKill
}

func (c *cgroupV2) remove() error { return c.m.Delete() }

// ProbeCgroups reports whether a cgroup can be made under parent: the
// agent makes one and removes it at start, and says once when it cannot.
func ProbeCgroups(parent string) error {
	cg, err := newCgroup(parent, "probe-"+strconv.Itoa(os.Getpid()), runspec.Limits{})
	if err != nil {
		return err
	}
	return cg.remove()
}
