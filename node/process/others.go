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
// stateDir's module directory records. One entry per module and shim,
// sorted by module. Processes whose environment cannot be read are not
// seen (an agent that is not root reads only its own user's).
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

// recordedShim is the shim pid stateDir records for module (0: none).
func recordedShim(stateDir, module string) int {
	var id shim.Identity
	if shim.ReadJSON(filepath.Join(stateDir, "process", module), shim.ShimFile, &id) != nil || !id.Live() {
		return 0
	}
	return id.PID
}

// OthersError refuses an agent's start while modules of its node run
// under shims of another state directory ([Others]).
type OthersError struct {
	Node, Root, StateDir string
	Others               []Other
}

func (e *OthersError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "modules of node %s already run under root %s, started from another state directory than %s:", e.Node, e.Root, e.StateDir)
	for i, o := range e.Others {
		if i > 0 {
			b.WriteString(";")
		}
		switch {
		case o.ShimPID == 0:
			fmt.Fprintf(&b, " %s (pid %d, without a shim)", o.Module, o.PID)
		case o.Removed:
			fmt.Fprintf(&b, " %s (shim pid %d, its state dir %s since removed)", o.Module, o.ShimPID, o.StateDir)
		case o.StateDir == "":
			fmt.Fprintf(&b, " %s (shim pid %d)", o.Module, o.ShimPID)
		default:
			fmt.Fprintf(&b, " %s (shim pid %d, state dir %s)", o.Module, o.ShimPID, o.StateDir)
		}
	}
	b.WriteString(": this agent would start each a second time. Point --state-dir at their state dir (the agent adopts them), or stop them (kill -TERM each shim pid: it stops its module) and start again")
	return b.String()
}
