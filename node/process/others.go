package process

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/meshfold/meshfold/node/process/shim"
)

// Other is a module of the node running under a shim this state
// directory did not start: one a runtime opened on it would not adopt,
// and would start a second time.
type Other struct {
	Module   string
	ShimPID  int    // 0: the module's process has no shim (its shim died)
	PID      int    // a process of the module
	PGID     int    // PID's process group
	StateDir string // the shim's state directory now ("" when unknown); Removed: it was deleted
	Removed  bool
}

// Others lists, by /proc, the modules of node (MESHFOLD_NODE) whose
// processes run under root (MESHFOLD_ROOT) but whose shim is not one of
// stateDir's: the shims of a state directory that was wiped, moved or
// replaced by another --state-dir while they ran (a fresh user's finding
// U33: an agent on the new directory started every module a second time,
// and the old shims ran on, unsupervised). A shim is stateDir's when the
// log it writes to (its stdout, <state-dir>/process/<module>/shim.log)
// is in stateDir, or, where that cannot be read, when its pid is the one
// stateDir's module directory records. A process of a module whose shim
// is gone is stateDir's, and not listed, when stateDir records that shim
// (in this boot, now dead) and the process is traceable to it (see
// [ownOrphan]): the runtime opened on stateDir kills it and reports the
// module stopped, and the agent starts it again (a fresh user's finding
// F3: a shim killed -9 left its module running, and the node's next agent
// refused to start, blaming the state directory). One entry per module
// and shim, sorted by module. Processes whose environment cannot be read
// are not seen (an agent that is not root reads only its own user's).
func Others(node, root, stateDir string) []Other {
	root, _ = filepath.Abs(root)
	stateDir, _ = filepath.Abs(stateDir)
	if d, err := filepath.EvalSymlinks(stateDir); err == nil {
		stateDir = d
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	wantNode, wantRoot := []byte("MESHFOLD_NODE="+node), []byte("MESHFOLD_ROOT="+root)
	ofNode := func(pid int) (module string, ok bool) {
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
		if err != nil {
			return "", false
		}
		var n, r bool
		for _, v := range bytes.Split(data, []byte{0}) {
			switch {
			case bytes.Equal(v, wantNode):
				n = true
			case bytes.Equal(v, wantRoot):
				r = true
			case bytes.HasPrefix(v, []byte("MESHFOLD_MODULE=")):
				module = string(v[len("MESHFOLD_MODULE="):])
			}
		}
		return module, n && r && module != ""
	}
	seen := map[[2]int]bool{}
	var out []Other
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		module, ok := ofNode(pid)
		if !ok {
			// A shim whose module has no process now (it waits out its
			// backoff) is found by the spec beside its log.
			if o, ok := shimOfNode(pid, wantNode, wantRoot); ok && !seen[[2]int{pid, 0}] && o.StateDir != stateDir {
				seen[[2]int{pid, 0}] = true
				out = append(out, o)
			}
			continue
		}
		// Up to the first ancestor outside the module: its shim.
		top := pid
		for {
			pp := parentOf(top)
			if pp <= 1 {
				top = 0
				break
			}
			if _, in := ofNode(pp); !in {
				top = pp
				break
			}
			top = pp
		}
		o := Other{Module: module, PID: pid}
		if top != 0 && isShimOf(top, module) {
			o.ShimPID = top
		}
		if o.ShimPID == 0 {
			if ownOrphan(stateDir, module, pid) {
				continue // its shim was this state directory's: the runtime reaps it
			}
			_, o.PGID = sessionOf(pid)
		}
		if o.ShimPID != 0 {
			dir, removed, known := shimStateDir(o.ShimPID)
			if known && !removed && dir == stateDir {
				continue // this state directory's own shim
			}
			if !known && recordedShim(stateDir, module) == o.ShimPID {
				continue
			}
			o.StateDir, o.Removed = dir, removed
		}
		k := [2]int{o.ShimPID, 0}
		if o.ShimPID == 0 {
			k = [2]int{0, pid}
		}
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, o)
	}
	slices.SortFunc(out, func(a, b Other) int {
		return cmpOr(strings.Compare(a.Module, b.Module), a.ShimPID-b.ShimPID, a.PID-b.PID)
	})
	return out
}

func cmpOr(v ...int) int {
	for _, x := range v {
		if x != 0 {
			return x
		}
	}
	return 0
}

// parentOf returns pid's parent (0 when unknown).
func parentOf(pid int) int {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 2 {
		return 0
	}
	pp, _ := strconv.Atoi(f[1])
	return pp
}

// isShimOf reports whether pid is a shim of module: its last argument is
// a module directory <state-dir>/process/<module>.
func isShimOf(pid int, module string) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
	dir := args[len(args)-1]
	return filepath.Base(dir) == module && filepath.Base(filepath.Dir(dir)) == "process"
}

// shimStateDir is the state directory of the shim pid as it is now: its
// stdout is its shim.log, whose path the kernel follows through a move
// (and marks deleted when it was removed).
func shimStateDir(pid int) (dir string, removed, known bool) {
	p, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/1")
	if err != nil {
		return "", false, false
	}
	p, removed = strings.CutSuffix(p, " (deleted)")
	if filepath.Base(p) != shim.ShimLog {
		return "", false, false
	}
	return filepath.Dir(filepath.Dir(filepath.Dir(p))), removed, true
}

// shimOfNode reports whether pid is a shim whose module's spec (beside
// its log, in its state directory as it is now) gives the module
// MESHFOLD_NODE and MESHFOLD_ROOT as wantNode and wantRoot ("NAME=value").
func shimOfNode(pid int, wantNode, wantRoot []byte) (Other, bool) {
	dir, removed, known := shimStateDir(pid)
	if !known || removed {
		return Other{}, false
	}
	p, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/1")
	modDir := filepath.Dir(p)
	var sp shim.Spec
	if shim.ReadJSON(modDir, shim.SpecFile, &sp) != nil || !isShimOf(pid, filepath.Base(modDir)) {
		return Other{}, false
	}
	if !slices.Contains(sp.Env, string(wantNode)) || !slices.Contains(sp.Env, string(wantRoot)) {
		return Other{}, false
	}
	return Other{Module: filepath.Base(modDir), ShimPID: pid, StateDir: dir}, true
}

// ownOrphan reports whether pid, a process of module that has no shim,
// is of the module stateDir's shim ran: stateDir records that shim, in
// this boot, and it is dead; and pid is traceable to it: in the session
// the shim made (its sid is the shim's pid, which the kernel does not give
// another process while the session has a member), in the process group
// of the module's recorded main process (the same for its pid), or in
// the module's cgroup. A process that made a session of its own (a
// daemon) where no cgroup holds it is not traceable, and stays listed.
func ownOrphan(stateDir, module string, pid int) bool {
	dir := filepath.Join(stateDir, "process", module)
	var sh shim.Identity
	if shim.ReadJSON(dir, shim.ShimFile, &sh) != nil || sh.PID <= 0 || sh.Boot != shim.BootID() || sh.Live() {
		return false
	}
	sid, pgid := sessionOf(pid)
	if sid == sh.PID {
		return true
	}
	var mod shim.Identity
	if shim.ReadJSON(dir, shim.ModuleFile, &mod) == nil && mod.PID > 0 && mod.Boot == sh.Boot && (pgid == mod.PID || pid == mod.PID) {
		return true
	}
	var sp shim.Spec
	if shim.ReadJSON(dir, shim.SpecFile, &sp) != nil || sp.Cgroup == "" {
		return false
	}
	return inCgroup(pid, "/"+filepath.Join(sp.Cgroup, shim.CgroupName(module, dir)))
}

// sessionOf returns pid's session and process group (0s when unknown).
func sessionOf(pid int) (sid, pgid int) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, 0
	}
	// Fields 3 on: the state, the parent, the process group, the session.
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 4 {
		return 0, 0
	}
	pgid, _ = strconv.Atoi(f[2])
	sid, _ = strconv.Atoi(f[3])
	return sid, pgid
}

// inCgroup reports whether pid is in the cgroup path (in any hierarchy:
// /proc/<pid>/cgroup's lines are id:controllers:path).
func inCgroup(pid int, path string) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return false
	}
	for l := range strings.SplitSeq(string(data), "\n") {
		if f := strings.SplitN(l, ":", 3); len(f) == 3 && (f[2] == path || strings.HasSuffix(f[2], path)) {
			return true
		}
	}
	return false
}

// recordedShim is the shim pid stateDir records for module (0: none).
func recordedShim(stateDir, module string) int {
	var id shim.Identity
	if shim.ReadJSON(filepath.Join(stateDir, "process", module), shim.ShimFile, &id) != nil || !id.Live() {
		return 0
	}
	return id.PID
}

// OthersError refuses an agent's start while modules of its node run
// under shims of another state directory, or without a shim that its own
// state directory records ([Others]).
type OthersError struct {
	Node, Root, StateDir string
	Others               []Other
}

func (e *OthersError) Error() string {
	var shimmed, orphans []Other
	for _, o := range e.Others {
		if o.ShimPID == 0 {
			orphans = append(orphans, o)
		} else {
			shimmed = append(shimmed, o)
		}
	}
	var b strings.Builder
	if len(shimmed) > 0 {
		fmt.Fprintf(&b, "modules of node %s already run under root %s, started from another state directory than %s:", e.Node, e.Root, e.StateDir)
		for i, o := range shimmed {
			if i > 0 {
				b.WriteString(";")
			}
			switch {
			case o.Removed:
				fmt.Fprintf(&b, " %s (shim pid %d, its state dir %s since removed)", o.Module, o.ShimPID, o.StateDir)
			case o.StateDir == "":
				fmt.Fprintf(&b, " %s (shim pid %d)", o.Module, o.ShimPID)
			default:
				fmt.Fprintf(&b, " %s (shim pid %d, state dir %s)", o.Module, o.ShimPID, o.StateDir)
			}
		}
	}
	// A process whose shim died (killed -9, by the OOM killer, by a stop
	// of the shims' scope) and that this state directory cannot trace to
	// a shim it records: no shim pid to name, nor a state directory.
	var groups []string
	if len(orphans) > 0 {
		if len(shimmed) > 0 {
			b.WriteString("; and")
		} else {
			fmt.Fprintf(&b, "modules of node %s already run under root %s", e.Node, e.Root)
		}
		fmt.Fprintf(&b, " without a shim (it was killed or crashed), not one that %s records:", e.StateDir)
		for i, o := range orphans {
			if i > 0 {
				b.WriteString(";")
			}
			if o.PGID > 0 {
				fmt.Fprintf(&b, " %s (pid %d, process group %d)", o.Module, o.PID, o.PGID)
				if g := "-" + strconv.Itoa(o.PGID); !slices.Contains(groups, g) {
					groups = append(groups, g)
				}
			} else {
				fmt.Fprintf(&b, " %s (pid %d)", o.Module, o.PID)
			}
		}
	}
	b.WriteString(": this agent would start each a second time. ")
	if len(shimmed) > 0 {
		b.WriteString("Point --state-dir at their state dir (the agent adopts them), or stop them (kill -TERM each shim pid: it stops its module)")
		if len(orphans) > 0 {
			b.WriteString("; ")
		}
	}
	if len(orphans) > 0 {
		if len(shimmed) > 0 {
			b.WriteString("nothing")
		} else {
			b.WriteString("Nothing")
		}
		b.WriteString(" supervises a module without its shim: stop it by its process group")
		if len(groups) > 0 {
			b.WriteString(" (kill -TERM -- " + strings.Join(groups, " ") + ")")
		}
	}
	b.WriteString(" and start again")
	return b.String()
}
