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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// A temporary file as writeFile names them, as a kill -9 mid-write
// leaves it: holding the content.
const leftover = ".key.meshfold-0123456789abcdef"

// Removing a module deletes its filled files and the temporary files of
// its interrupted writes; another module's files stay.
func TestRemovalDeletesFilledFiles(t *testing.T) {
	e := newEnv(t)
	a := e.startAgent(t, "ace", nil)
	alpha := events.PlanModule{Name: "alpha", Build: "a:1", RunsAs: "ua", Files: []events.File{{Path: "/etc/alpha/key", Mode: "0600"}}}
	bravo := events.PlanModule{Name: "bravo", Build: "b:1", RunsAs: "ub", Files: []events.File{{Path: "/etc/bravo/key", Mode: "0600"}}}
	p1 := e.publishPlan(t, "ace", "prov", alpha, bravo)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p1))
	for _, m := range []events.PlanModule{alpha, bravo} {
		if r, _ := e.fill(t, "ace", m.Name, m.Files[0].Path, "prov", []byte(secret)); !r.OK {
			t.Fatalf("fill %s: %+v", m.Name, r)
		}
	}
	tmp := filepath.Join(a.root, "etc/alpha", leftover)
	if err := os.WriteFile(tmp, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	p2 := e.publishPlan(t, "ace", "prov", bravo)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p2))
	for _, f := range []string{"etc/alpha/key", "etc/alpha/" + leftover} {
		if _, err := os.Stat(filepath.Join(a.root, f)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s after its module's removal: %v, want it deleted", f, err)
		}
	}
	if _, err := os.Stat(filepath.Join(a.root, "etc/bravo/key")); err != nil {
		t.Errorf("the file of a module that stays: %v", err)
	}
}

// The record of declared files outlives the agent: a removal applied by
// the next agent, which never saw the plan that declared the file, still
// deletes it; and that agent deletes an interrupted write's temporary
// file on start, before it serves fills.
func TestNextAgentDeletesWhatItNeverSaw(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	root, state := filepath.Join(dir, "root"), filepath.Join(dir, "state")
	a1 := e.startAgentIn(t, "ace", root, state, nil)
	alpha := events.PlanModule{Name: "alpha", Build: "a:1", RunsAs: "ua", Files: []events.File{{Path: "/etc/alpha/key", Mode: "0600"}}}
	bravo := events.PlanModule{Name: "bravo", Build: "b:1", RunsAs: "ub", Files: []events.File{{Path: "/etc/bravo/key", Mode: "0600"}}}
	p1 := e.publishPlan(t, "ace", "prov", alpha, bravo)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p1))
	for _, m := range []events.PlanModule{alpha, bravo} {
		if r, _ := e.fill(t, "ace", m.Name, m.Files[0].Path, "prov", []byte(secret)); !r.OK {
			t.Fatalf("fill %s: %+v", m.Name, r)
		}
	}
	a1.stop()
	tmp := filepath.Join(root, "etc/bravo", leftover)
	if err := os.WriteFile(tmp, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	p2 := e.publishPlan(t, "ace", "prov", bravo) // alpha removed while no agent runs
	e.startAgentIn(t, "ace", root, state, nil)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p2))
	if _, err := os.Stat(filepath.Join(root, "etc/alpha/key")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the removed module's file: %v, want it deleted", err)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the interrupted write's temporary file: %v, want it deleted on start", err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/bravo/key")); err != nil {
		t.Errorf("the file of a module that stays: %v", err)
	}
}

// supRuntime is a DirRuntime with the Supervisor interface: the test
// drives its changes and sees its fills.
type supRuntime struct {
	*DirRuntime
	changes chan struct{}
	mu      sync.Mutex
	filled  []string
	fills   chan string
}

func (s *supRuntime) Changes() <-chan struct{} { return s.changes }

func (s *supRuntime) Filled(_ context.Context, module string) {
	s.mu.Lock()
	s.filled = append(s.filled, module)
	s.mu.Unlock()
	s.fills <- module
}

// An accepted fill tells a Supervisor runtime; a refused one does not.
func TestFillTellsSupervisor(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	dr, err := NewDirRuntime(filepath.Join(dir, "records"))
	if err != nil {
		t.Fatal(err)
	}
	rt := &supRuntime{DirRuntime: dr, changes: make(chan struct{}, 1), fills: make(chan string, 4)}
	e.startAgentIn(t, "ace", filepath.Join(dir, "root"), filepath.Join(dir, "state"), rt)
	alpha := events.PlanModule{Name: "alpha", Build: "a:1", RunsAs: "ua", Files: []events.File{{Path: "/etc/alpha/key", Mode: "0600"}}}
	p := e.publishPlan(t, "ace", "prov", alpha)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p))
	if r, _ := e.fill(t, "ace", "alpha", "/etc/alpha/other", "prov", []byte(secret)); r.OK {
		t.Fatal("an undeclared write was accepted")
	}
	if r, _ := e.fill(t, "ace", "alpha", "/etc/alpha/key", "prov", []byte(secret)); !r.OK {
		t.Fatalf("fill: %+v", r)
	}
	// The fill's reply came after Filled returned.
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.filled) != 1 || rt.filled[0] != "alpha" {
		t.Errorf("Filled calls %v, want one for alpha (the accepted write only)", rt.filled)
	}
}

// Every change a Supervisor reports that the have shows brings a have,
// and two haves are at least HaveEvery apart in the stream, however fast
// the changes come.
func TestHavesOnChangesAtMostOneAnInterval(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	dr, err := NewDirRuntime(filepath.Join(dir, "records"))
	if err != nil {
		t.Fatal(err)
	}
	rt := &supRuntime{DirRuntime: dr, changes: make(chan struct{}, 1), fills: make(chan string, 4)}
	const every = 150 * time.Millisecond
	e.startAgentIn(t, "ace", filepath.Join(dir, "root"), filepath.Join(dir, "state"), rt,
		func(c *Config) { c.HaveEvery = every })
	e.waitEvent(t, "ace", events.KindHave, func(store.Msg) bool { return true })
	// A burst of changes, each reported once the agent took the previous
	// one: each is followed by a have, spaced out.
	for i := 0; i < 4; i++ {
		if err := dr.Apply(ctxT(t), events.PlanModule{Name: fmt.Sprintf("m%d", i), Build: "b:1"}); err != nil {
			t.Fatal(err)
		}
		rt.changes <- struct{}{}
		n := i + 2
		e.waitEvent(t, "ace", events.KindHave, func(store.Msg) bool { n--; return n == 0 })
	}
	haves := e.events(t, "ace", events.KindHave)
	if len(haves) < 5 {
		t.Fatalf("%d haves, want one at start and one per change", len(haves))
	}
	for i := 1; i < len(haves); i++ {
		if d := haves[i].Event.Time.Sub(haves[i-1].Event.Time); d < every {
			t.Errorf("haves %d and %d are %s apart in the stream, want at least %s", i-1, i, d, every)
		}
	}
}

// logRuntime is a DirRuntime whose modules "printed" fixed lines.
type logRuntime struct {
	*DirRuntime
}

func (logRuntime) Logs(_ context.Context, module string, q LogQuery) (LogPage, error) {
	if module != "alpha" {
		return LogPage{}, fmt.Errorf("%w %q", ErrNoModule, module)
	}
	return LogPage{Lines: []string{"hello", "tail=" + strconv.Itoa(q.Tail)}, Cursor: "1:2"}, nil
}

// The logs endpoint serves a LogReader runtime's pages, says which module
// is unknown, and says so when the runtime captures nothing.
func TestLogsEndpoint(t *testing.T) {
	e := newEnv(t)
	ask := func(module string) LogsReply {
		t.Helper()
		body, _ := json.Marshal(LogsRequest{Module: module, LogQuery: LogQuery{Tail: 7}})
		var r LogsReply
		deadline := time.Now().Add(wait)
		for {
			msg, err := e.nc.Request(LogsSubject(e.cfg.Prefix, "ace"), body, wait)
			if errors.Is(err, nats.ErrNoResponders) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond) // poll interval while the service registers, not synchronisation
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(msg.Data, &r); err != nil {
				t.Fatal(err)
			}
			return r
		}
	}
	dir := t.TempDir()
	dr, err := NewDirRuntime(filepath.Join(dir, "records"))
	if err != nil {
		t.Fatal(err)
	}
	a := e.startAgentIn(t, "ace", filepath.Join(dir, "root"), filepath.Join(dir, "state"), logRuntime{dr})
	if r := ask("alpha"); r.Error != "" || strings.Join(r.Lines, "|") != "hello|tail=7" || r.Cursor != "1:2" {
		t.Errorf("logs of alpha: %+v", r)
	}
	if r := ask("bravo"); !strings.Contains(r.Error, "no such module") {
		t.Errorf("logs of an unknown module: %+v", r)
	}
	if r := ask("Bad!"); !strings.Contains(r.Error, "bad logs request") {
		t.Errorf("logs of a bad name: %+v", r)
	}
	a.stop()
	e.startAgent(t, "ace", nil) // a DirRuntime captures nothing
	if r := ask("alpha"); !strings.Contains(r.Error, "captures no output") {
		t.Errorf("logs from a recording runtime: %+v", r)
	}
}

// A file a module that stays no longer declares is deleted at the settle
// of the plan that drops it, with an interrupted write's temporary file;
// a path another module now declares, and a held module's files, stay
// (a fresh user's finding U32: the old credential stayed indefinitely).
func TestDroppedFileDeletedAtSettle(t *testing.T) {
	e := newEnv(t)
	a := e.startAgent(t, "ace", nil)
	file := func(p string) []events.File { return []events.File{{Path: p, Mode: "0600"}} }
	app := events.PlanModule{Name: "app", Build: "a:1", RunsAs: "ua", Files: file("/run/app/token")}
	web := events.PlanModule{Name: "web", Build: "w:1", RunsAs: "uw", Files: file("/run/web/key")}
	p1 := e.publishPlan(t, "ace", "prov", app, web)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p1))
	for _, m := range []events.PlanModule{app, web} {
		if r, _ := e.fill(t, "ace", m.Name, m.Files[0].Path, "prov", []byte(secret)); !r.OK {
			t.Fatalf("fill %s: %+v", m.Name, r)
		}
	}
	const tokenTmp = ".token.meshfold-0123456789abcdef"
	tmp := filepath.Join(a.root, "run/app", tokenTmp)
	if err := os.WriteFile(tmp, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	app2 := app
	app2.Files = file("/run/app/token2")
	webHeld := events.PlanModule{Name: "web", Build: "w:1", RunsAs: "uw", Held: true, Why: events.HoldApproval, Files: []events.File{}}
	p2 := e.publishPlan(t, "ace", "prov", app2, webHeld)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p2))
	for _, f := range []string{"run/app/token", "run/app/" + tokenTmp} {
		if _, err := os.Stat(filepath.Join(a.root, f)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s after its declaration was dropped: %v, want it deleted", f, err)
		}
	}
	if _, err := os.Stat(filepath.Join(a.root, "run/web/key")); err != nil {
		t.Errorf("the file of a held module: %v, want it kept", err)
	}
	// Once the module is removed, what it was ever declared goes.
	p3 := e.publishPlan(t, "ace", "prov", app2)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p3))
	if _, err := os.Stat(filepath.Join(a.root, "run/web/key")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the held module's file after its removal: %v", err)
	}
}

// crashingRuntime is a supRuntime whose modules report failed, exit status
// 1, once fail is set.
type crashingRuntime struct {
	*supRuntime
	fail atomic.Bool
}

func (f *crashingRuntime) Running(ctx context.Context) ([]events.HaveModule, error) {
	mods, err := f.supRuntime.Running(ctx)
	if f.fail.Load() {
		for i := range mods {
			mods[i].State, mods[i].Restarts, mods[i].Exit = events.Failed, 3, "status 1"
		}
	}
	return mods, err
}

// A failing module's declared files that are missing on the node are
// reported in the have's missing list (a fresh user's finding U21: the
// module crash-looped and nothing named the file, nor refilled it, until
// the resync); the reconciler asks for the refill of those filled before.
// A file that is back is reported no more, and a running module that
// never restarted is not looked at, but a file reported missing is looked
// at again until it is back.
func TestHaveReportsMissingFiles(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	dr, err := NewDirRuntime(filepath.Join(dir, "records"))
	if err != nil {
		t.Fatal(err)
	}
	rt := &crashingRuntime{supRuntime: &supRuntime{DirRuntime: dr, changes: make(chan struct{}, 1), fills: make(chan string, 8)}}
	a := e.startAgentIn(t, "ace", filepath.Join(dir, "root"), filepath.Join(dir, "state"), rt)
	app := events.PlanModule{Name: "app", Build: "a:1", RunsAs: "ua", Files: []events.File{{Path: "/run/app/token", Mode: "0600"}, {Path: "/run/app/ca", Mode: "0600"}}}
	p := e.publishPlan(t, "ace", "prov", app)
	e.waitEvent(t, "ace", events.KindSettle, settleOf(p))
	for _, path := range []string{"/run/app/token", "/run/app/ca"} {
		if r, _ := e.fill(t, "ace", "app", path, "prov", []byte(secret)); !r.OK {
			t.Fatalf("fill %s: %+v", path, r)
		}
		<-rt.fills
	}
	haveWith := func(state events.RunState, missing ...string) {
		t.Helper()
		var want []events.MissingFile
		for _, p := range missing {
			want = append(want, events.MissingFile{Module: "app", Path: p})
		}
		rt.changes <- struct{}{}
		e.waitEvent(t, "ace", events.KindHave, func(m store.Msg) bool {
			h := m.Event.Payload.(*events.Have)
			return len(h.Modules) == 1 && h.Modules[0].State == state && slices.Equal(h.Missing, want)
		})
	}
	haveWith(events.Running) // running, its files in place
	if err := os.Remove(filepath.Join(a.root, "run/app/token")); err != nil {
		t.Fatal(err)
	}
	haveWith(events.Running) // running and never restarted: not looked at
	rt.fail.Store(true)
	haveWith(events.Failed, "/run/app/token")
	if err := os.Remove(filepath.Join(a.root, "run/app/ca")); err != nil {
		t.Fatal(err)
	}
	haveWith(events.Failed, "/run/app/ca", "/run/app/token")
	if !strings.Contains(a.logs.String(), "declared files missing on the node") {
		t.Error("the log does not say the files are missing")
	}
	if r, _ := e.fill(t, "ace", "app", "/run/app/token", "prov", []byte(secret)); !r.OK {
		t.Fatalf("refill: %+v", r)
	}
	<-rt.fills
	haveWith(events.Failed, "/run/app/ca")
	// Running again (its restarts cleared by the runtime here), the file
	// reported missing is still looked at until it is back.
	rt.fail.Store(false)
	haveWith(events.Running, "/run/app/ca")
	if r, _ := e.fill(t, "ace", "app", "/run/app/ca", "prov", []byte(secret)); !r.OK {
		t.Fatalf("refill: %+v", r)
	}
	<-rt.fills
	haveWith(events.Running)
}
