package shim

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/atomicfile"
	"github.com/meshfold/meshfold/node/bundle/runspec"
)

// Files of a module's directory, <state dir>/process/<module>/.
const (
	SpecFile   = "spec.json"   // what the shim runs, written by the runtime
	ShimFile   = "shim.json"   // the shim's pid and start time, written by the shim
	ModuleFile = "module.json" // the module process's pid and start time, written by the shim
	SockFile   = "shim.sock"   // the shim's unix socket
	LogFile    = "module.log"  // the module's stdout and stderr (rotated: module-<time>.log)
	ShimLog    = "shim.log"    // the shim's own log lines
)

// Protocol is the version of what the runtime and a shim say to each
// other (spec.json, shim.json, module.json, the requests and statuses on
// shim.sock). A shim refuses a spec of another protocol and the runtime
// drives no shim that reports another; a record or status without one
// (written before it was recorded) is protocol 1. Raise it with any
// change an older or newer peer would misread.
const Protocol = 1

// Spec is what one shim runs, as the runtime writes it to spec.json.
type Spec struct {
	// Protocol is the runtime's [Protocol].
	Protocol int    `json:"protocol,omitempty"`
	Module   string `json:"module"`
	Build    string `json:"build"`
	Account  string `json:"account,omitempty"` // the plan's runs_as
	// User is the resolved account to switch to; nil runs the module as
	// the shim's own user (an agent that is not root).
	User *Account `json:"user,omitempty"`
	// As is the account the module's process really runs as: User's, or
	// the agent's own when it is not root. A have reports it.
	As          string        `json:"as,omitempty"`
	Dir         string        `json:"dir"`
	Argv        []string      `json:"argv"`
	Env         []string      `json:"env"`
	StopSignal  int           `json:"stop_signal"`
	StopTimeout time.Duration `json:"stop_timeout"`
	// OnFillRestart and OnFillSignal are the manifest's on_fill.
	OnFillRestart bool    `json:"on_fill_restart,omitempty"`
	OnFillSignal  int     `json:"on_fill_signal,omitempty"`
	Backoff       Backoff `json:"backoff"`
	LogMaxMB      int     `json:"log_max_mb"`
	LogBackups    int     `json:"log_backups"`
	Restarts      int     `json:"restarts,omitempty"` // counted from here (a shim replacing a lost one)
	FillRestarts  int     `json:"fill_restarts,omitempty"`
	// Cgroup is the parent of the module's cgroup; empty: the runtime
	// could make none, and the module's tree is its shim's descendants.
	Cgroup string          `json:"cgroup,omitempty"`
	Limits *runspec.Limits `json:"limits,omitempty"`
	Health *runspec.Health `json:"health,omitempty"`
	Since  time.Time       `json:"since"`
	// Files are the paths on the node of the files the module's plan row
	// declares (filled files): an exec check's output holding their
	// content is left out of the module's log. The runtime rewrites
	// spec.json when they change and the shim runs on; the shim reads
	// them from there when it judges an output. Optional: a spec without
	// it (an older runtime's) leaves nothing out, and an older shim logs
	// no check output.
	Files []string `json:"files,omitempty"`
}

// Same reports whether s and o run the same thing (what a re-apply of an
// unchanged row finds).
func (s Spec) Same(o Spec) bool {
	return s.Build == o.Build && s.Account == o.Account && s.Dir == o.Dir
}

// Backoff paces the restarts of a module whose process exited: Initial
// doubling to Max; a process that ran at least Reset starts the sequence
// again. Zero fields take DESIGN.md §8's figures (1 s, 5 min, 10 min).
type Backoff struct {
	Initial time.Duration `json:"initial"`
	Max     time.Duration `json:"max"`
	Reset   time.Duration `json:"reset"`
}

// DefaultBackoff is DESIGN.md §8's restart pacing (the kubelet's
// CrashLoopBackOff figures).
var DefaultBackoff = Backoff{Initial: time.Second, Max: 5 * time.Minute, Reset: 10 * time.Minute}

func (b Backoff) WithDefaults() Backoff {
	if b.Initial <= 0 {
		b.Initial = DefaultBackoff.Initial
	}
	if b.Max <= 0 {
		b.Max = DefaultBackoff.Max
	}
	if b.Max < b.Initial {
		b.Max = b.Initial
	}
	if b.Reset <= 0 {
		b.Reset = DefaultBackoff.Reset
	}
	return b
}

// Status is what a shim reports of its module.
type Status struct {
	Module  string          `json:"module"`
	Build   string          `json:"build"`
	Account string          `json:"account,omitempty"`
	State   events.RunState `json:"state"`
	// PID and PIDStart identify the module's process (0 when none runs).
	PID      int    `json:"pid,omitempty"`
	PIDStart uint64 `json:"pid_start,omitempty"`
	// Restarts counts the starts after the first since the module's
	// apply, but for the on_fill restarts (FillRestarts).
	Restarts int `json:"restarts"`
	// FillRestarts counts the restarts that were the module's on_fill
	// action: a filled file written, not a crash.
	FillRestarts int `json:"fill_restarts,omitempty"`
	// Exit is the last exit: "status N", "signal SIGNAME" or "start: why".
	Exit string `json:"exit,omitempty"`
	// Since is when State last changed, or when a running module was
	// started again for a fill (on_fill: restart).
	Since time.Time `json:"since"`
	// Backoff is the wait before the next start while State is failed.
	Backoff time.Duration `json:"backoff,omitempty"`
	// Health is what the module's check says; empty without a check.
	Health events.Health `json:"health,omitempty"`
	// ShimPID and ShimStart identify the shim.
	ShimPID   int    `json:"shim_pid"`
	ShimStart uint64 `json:"shim_start"`
	// Protocol is the shim's [Protocol]; 0 from a shim older than the
	// field, which speaks protocol 1 (see [Status.Speaks]).
	Protocol int `json:"protocol,omitempty"`
}

// Speaks is the protocol the reporting shim speaks.
func (s Status) Speaks() int { return max(s.Protocol, 1) }

// Request is one line the runtime sends a shim.
type Request struct {
	Op string `json:"op"` // opStatus, opWatch, opWake, opStop
	// At is, for a wake, when the fill was known written: CLOCK_BOOTTIME
	// in nanoseconds, a clock every process of the host shares.
	At int64 `json:"at,omitempty"`
}

const (
	OpStatus = "status" // reply: one Status
	OpWatch  = "watch"  // reply: a Status now and on every change, until the connection closes
	OpWake   = "wake"   // a filled file was written; reply: one Status
	OpStop   = "stop"   // stop the module and exit; reply: the final Status
)

// Identity is a process's pid, start time and the boot it started in,
// as shim.json and module.json hold them: together they name one process
// (a pid is recycled, a start time repeats after a reboot).
type Identity struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
	Boot  string `json:"boot,omitempty"`
}

// Live reports whether id names a live process: its pid alive with its
// start time, in this boot. A record without a boot id (written before
// they were recorded) is judged by pid and start time.
func (id Identity) Live() bool {
	return (id.Boot == "" || id.Boot == BootID()) && Alive(id.PID, id.Start)
}

// BootID is this boot's id (/proc/sys/kernel/random/boot_id), "" if
// unreadable.
var BootID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
})

// WriteJSON writes v to dir/name atomically and durably
// (atomicfile.Write: temp file, fsync, rename, fsync of the directory),
// mode 0600: a power loss leaves the old record or the new, never an
// empty one.
func WriteJSON(dir, name string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, name), append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

// ReadJSON reads dir/name into v. Errors: the file's (fs.ErrNotExist when
// there is none) or its JSON's.
func ReadJSON(dir, name string, v any) error {
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}
