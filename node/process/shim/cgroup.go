package shim

import (
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"syscall"

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
// dir: the module's name and a hash of the directory, so two agents on a
// host (two state directories) never share one, and a shim that replaces
// a lost one finds its predecessor's.
func CgroupName(module, dir string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(dir))
	return fmt.Sprintf("%s-%012x", module, h.Sum64()&0xffffffffffff)
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
		return &cgroupV2{m: m, dir: filepath.Join(cgroupV2Root, path)}, nil
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
		return &cgroupV1{cg: cg, own: own, by: subs[0].Name()}, nil
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
}

// spawn forks from a thread of its own that it first moves into the
// cgroup (v1 places threads, and a child is born in its parent thread's
// cgroups), then moves back. Should the move back fail, the thread is
// never used again: its goroutine ends locked to it, and Go ends it.
func (c *cgroupV1) spawn(_ *syscall.SysProcAttr, start func() (*os.Process, error)) (*os.Process, error) {
	type result struct {
		p   *os.Process
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		tid := cgroup1.Process{Pid: unix.Gettid()}
		if err := c.cg.AddTask(tid); err != nil {
			_ = c.own.AddTask(tid)
			ch <- result{nil, fmt.Errorf("join the module's cgroup: %w", err)}
			return
		}
		p, err := start()
		ch <- result{p, err}
		if c.own.AddTask(tid) == nil {
			runtime.UnlockOSThread()
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
	m   *cgroup2.Manager
	dir string
}

// spawn starts the child in the cgroup with clone3's CLONE_INTO_CGROUP.
func (c *cgroupV2) spawn(attr *syscall.SysProcAttr, start func() (*os.Process, error)) (*os.Process, error) {
	fd, err := unix.Open(c.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
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
