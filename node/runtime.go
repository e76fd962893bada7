package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/atomicfile"
)

// Runtime is how the agent makes modules run. A real engine (systemd,
// containers, …) implements it; [DirRuntime] only records. The agent calls
// one method at a time, from one goroutine, but Running may also be called
// from the have publisher concurrently: implementations must be safe for
// concurrent use.
type Runtime interface {
	// Apply makes module.Name run at module.Build as the account
	// module.RunsAs, replacing what ran before under that name, and
	// returns once it runs. The row's files are the provisioner's to fill:
	// Apply must not create them. An error means the module does not run
	// the row's build; the agent reports the plan as failed.
	Apply(ctx context.Context, module events.PlanModule) error
	// Remove stops the module and forgets it. Removing a module that does
	// not run is not an error.
	Remove(ctx context.Context, name string) error
	// Running reports every module the runtime holds (running, stopped or
	// failed), sorted by name: what a have reports. A module that is not
	// running may have an empty build.
	Running(ctx context.Context) ([]events.HaveModule, error)
}

// DirRuntime is a [Runtime] that starts no process. Apply records the
// module's build and account in Dir/<module>.json (written atomically);
// Remove deletes that file; Running reports every record as running. It is
// meant for demos, tests and dry runs: it shows what a node would run.
// The agent's command line keeps it under the node's root, in
// <root>/.meshfold/modules, a directory fill requests may not write into
// ([ReservedDir]).
type DirRuntime struct {
	dir string
	mu  sync.Mutex
}

var _ Runtime = (*DirRuntime)(nil)

// NewDirRuntime returns a DirRuntime recording under dir, creating dir
// (mode 0755) when needed.
//
// Errors: dir empty, or the directory cannot be created.
func NewDirRuntime(dir string) (*DirRuntime, error) {
	if dir == "" {
		return nil, errors.New("dir runtime: directory is required")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("dir runtime: %w", err)
	}
	return &DirRuntime{dir: dir}, nil
}

// Dir returns the directory the records are kept in.
func (r *DirRuntime) Dir() string { return r.dir }

// record is the JSON of one DirRuntime record.
type record struct {
	Name    string `json:"name"`
	Build   string `json:"build"`
	Account string `json:"account,omitempty"`
}

func (r *DirRuntime) file(name string) string { return filepath.Join(r.dir, name+".json") }

// Apply records the module's build and account.
//
// Errors: an invalid module name (matching events.ErrInvalid), an empty
// build, ctx's error, or the file system's.
func (r *DirRuntime) Apply(ctx context.Context, m events.PlanModule) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !events.ValidName(m.Name) {
		return &events.FieldError{Field: "name", Value: m.Name, Err: events.ErrBadName}
	}
	if m.Build == "" {
		return fmt.Errorf("apply %s: %w", m.Name, &events.FieldError{Field: "build", Err: events.ErrMissing})
	}
	data, err := json.Marshal(record{Name: m.Name, Build: m.Build, Account: m.RunsAs})
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := atomicfile.Write(r.file(m.Name), append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("apply %s: %w", m.Name, err)
	}
	return nil
}

// Remove deletes the module's record; a missing record is not an error.
//
// Errors: an invalid module name (matching events.ErrInvalid), ctx's
// error, or the file system's.
func (r *DirRuntime) Remove(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !events.ValidName(name) {
		return &events.FieldError{Field: "name", Value: name, Err: events.ErrBadName}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := os.Remove(r.file(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	return nil
}

// Running reports every record as a running module, sorted by name.
// Files that are not records (other names, unreadable JSON) are skipped.
//
// Errors: ctx's error, or an unreadable directory.
func (r *DirRuntime) Running(ctx context.Context) ([]events.HaveModule, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ents, err := os.ReadDir(r.dir)
	if err != nil {
		return nil, fmt.Errorf("dir runtime: %w", err)
	}
	out := []events.HaveModule{}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !e.Type().IsRegular() || !events.ValidName(name) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(r.dir, e.Name()))
		if err != nil {
			continue
		}
		var rec record
		if json.Unmarshal(data, &rec) != nil || rec.Name != name || rec.Build == "" {
			continue
		}
		out = append(out, events.HaveModule{Name: name, Build: rec.Build, State: events.Running, Account: rec.Account})
	}
	slices.SortFunc(out, func(a, b events.HaveModule) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// AccountMapper is implemented by a [Runtime] whose modules may run as
// another account than their row's runs_as (the process runtime of an
// agent that is not root runs every module as the agent's own user). Its
// have reports the account the process really runs as; the agent compares
// that with RunningAs(row.RunsAs), not with runs_as, when it decides
// whether a row already runs (DESIGN.md §8).
type AccountMapper interface {
	// RunningAs returns the account a module whose row says runsAs
	// would run as.
	RunningAs(runsAs string) string
}

// Supervisor is implemented by a [Runtime] whose modules change state on
// their own: a process exits, is restarted, crash-loops (the process
// runtime of DESIGN.md §8). The agent uses it when its runtime has it.
type Supervisor interface {
	// Changes receives a value whenever a module's state changes
	// (coalesced: one pending value at most). The agent publishes a have
	// for it, at most one a second.
	Changes() <-chan struct{}
	// Filled tells the runtime that a filled file of module was written:
	// a module waiting out its restart backoff starts at once, a running
	// one gets its on_fill action. It must return promptly: the fill's
	// reply waits for it.
	Filled(ctx context.Context, module string)
}

// LogQuery asks a [LogReader] for a module's captured output.
type LogQuery struct {
	// Tail is how many of the last lines to return when Cursor is empty
	// (0: as many as fit in one page); the lines that do not fit in one
	// page come in the next ones (see LogPage.More).
	Tail int `json:"tail,omitempty"`
	// Since, when Cursor is empty, starts at the first line written at or
	// after this RFC 3339 time (the later start of Since and Tail wins).
	Since string `json:"since,omitempty"`
	// Cursor continues after the position a previous page ended at.
	Cursor string `json:"cursor,omitempty"`
	// Wait is how long to wait for new output after Cursor when there is
	// none yet (a follow), in milliseconds; at most [MaxLogWait].
	WaitMS int `json:"wait_ms,omitempty"`
}

// MaxLogWait bounds a LogQuery's wait, so a follow's request is answered
// well within a NATS request timeout.
const MaxLogWait = 10 * time.Second

// LogPage is one page of a module's output: whole lines, oldest first,
// and the cursor to continue from.
type LogPage struct {
	Lines []string `json:"lines"`
	// Tags, when the runtime records them, say of each line (same index)
	// when it was written and which stream it came from.
	Tags   []LogTag `json:"tags,omitempty"`
	Cursor string   `json:"cursor"`
	// More: the page ended because it was full; more output follows at
	// Cursor already.
	More bool `json:"more,omitempty"`
}

// LogTag is when a line of output was captured and from which stream:
// "out" (stdout), "err" (stderr) or "meshfold" (a line of the module's
// supervisor: an exit, a restart); empty for a line captured untagged.
type LogTag struct {
	At     time.Time `json:"at,omitzero"`
	Stream string    `json:"stream,omitempty"`
}

// LogReader is implemented by a [Runtime] that captures its modules'
// stdout and stderr; the agent serves it as the "logs" endpoint.
type LogReader interface {
	// Logs returns a page of module's output. Errors: the module is
	// unknown (matching ErrNoModule), or its log cannot be read.
	Logs(ctx context.Context, module string, q LogQuery) (LogPage, error)
}

// ErrNoModule: the runtime holds no module of that name.
var ErrNoModule = errors.New("node agent: no such module")
