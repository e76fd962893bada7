package node

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/atomicfile"
	"github.com/meshfold/meshfold/store"
)

// DefaultHaveEvery is the least interval between two haves that a
// runtime's own changes bring (DESIGN.md §8: a have on every change, at
// most one a second). The have after an applied plan is not delayed: the
// reconciler judges what runs by it.
const DefaultHaveEvery = time.Second

// filesFile, in the state directory, records the files each module's
// settled plan declared, so a removal after an agent restart still knows
// which filled files to delete.
const filesFile = "module-files.json"

// loadFiles reads the record of declared files (empty when missing or
// unreadable: nothing is known to delete).
func (a *Agent) loadFiles() map[string][]string {
	var rec map[string][]string
	data, err := os.ReadFile(filepath.Join(a.cfg.StateDir, filesFile))
	if err == nil {
		err = json.Unmarshal(data, &rec)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		a.log.Warn("record of module files unreadable; starting a new one", "err", err)
	}
	if rec == nil {
		rec = map[string][]string{}
	}
	return rec
}

// noteFiles records the files of every module of p, the plan just
// settled, and deletes the filled files a module p keeps no longer
// declares (with their interrupted writes' temporary files): a credential
// does not outlive its declaration on disk, as it does not outlive its
// module (a fresh user's finding U32: a file moved to a new path left the
// old one, secret and all, indefinitely). A held row keeps what the
// record holds for it (it runs as before), and a path another row of p
// declares is never deleted. Called with a.mu held.
func (a *Agent) noteFiles(p *events.Plan) {
	rec := a.loadFiles()
	for name := range rec {
		if p.Module(name) == nil {
			delete(rec, name)
		}
	}
	declared := map[string]bool{}
	for _, m := range p.Modules {
		for _, f := range m.Files {
			declared[f.Path] = true
		}
	}
	for _, m := range p.Modules {
		var paths []string
		for _, f := range m.Files {
			paths = append(paths, f.Path)
		}
		for _, old := range rec[m.Name] {
			switch {
			case declared[old]:
			case m.Held || a.root == nil || !events.ValidPath(old):
				paths = append(paths, old) // deleted with the module, or once it is applied
			default:
				err := removeFile(a.root, old)
				if err != nil && !errors.Is(err, fs.ErrNotExist) {
					a.log.Warn("filled file no longer declared not deleted", "module", m.Name, "path", old, "err", err)
					paths = append(paths, old) // kept on record: the module's removal tries again
					continue
				}
				if err == nil {
					a.log.Info("filled file no longer declared deleted", "module", m.Name, "path", old)
				}
				delete(a.held, fileRef{m.Name, old})
				a.sweepTemp(old)
			}
		}
		slices.Sort(paths)
		rec[m.Name] = slices.Compact(paths)
	}
	data, err := json.Marshal(rec)
	if err == nil {
		err = atomicfile.Write(filepath.Join(a.cfg.StateDir, filesFile), data, 0o600)
	}
	if err != nil {
		a.log.Warn("record of module files not written", "err", err)
	}
}

// forgetFiles deletes the filled files of a removed module, and any
// temporary file an interrupted write of them left behind (DESIGN.md §8:
// a credential does not outlive its module on disk). Errors are logged:
// the removal itself has happened.
func (a *Agent) forgetFiles(module string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.root == nil {
		return
	}
	paths := a.loadFiles()[module]
	if a.settled != nil {
		if row := a.settled.Module(module); row != nil {
			for _, f := range row.Files {
				paths = append(paths, f.Path)
			}
		}
	}
	slices.Sort(paths)
	for _, p := range slices.Compact(paths) {
		if !events.ValidPath(p) {
			continue
		}
		delete(a.held, fileRef{module, p})
		if err := removeFile(a.root, p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			a.log.Warn("filled file of a removed module not deleted", "module", module, "path", p, "err", err)
		} else if err == nil {
			a.log.Info("filled file of a removed module deleted", "module", module, "path", p)
		}
		a.sweepTemp(p)
	}
}

// refitFiles gives row's declared files that exist on the node the owner
// (its runs_as) and mode row declares, as a fill would write them, so a
// plan that changes a module's account or a file's mode leaves no file
// the module cannot read, or one more open than declared (a fresh user's
// finding U31: the file kept its old owner and mode until a refill, and
// the module restarted as its new account met "Permission denied"). The
// content is untouched: no fill is needed. Called with a.mu held.
func (a *Agent) refitFiles(row *events.PlanModule) {
	if a.root == nil || row.Held {
		return
	}
	for _, f := range row.Files {
		changed, err := refitFile(a.root, f, row.RunsAs)
		if err != nil {
			a.log.Warn("filled file not given the plan's owner and mode", "module", row.Name, "path", f.Path, "err", err)
		} else if changed {
			a.log.Info("filled file given the plan's owner and mode", "module", row.Name, "path", f.Path, "mode", f.Mode, "account", row.RunsAs)
		}
	}
}

// heldFile records that ref is in place on the node (a fill wrote it or
// found it, or it was there at the agent's start): back, if a have
// reported it missing, so checkFiles looks at it again. Called with a.mu
// held.
func (a *Agent) heldFile(ref fileRef) {
	if a.held == nil {
		a.held = map[fileRef]bool{}
	}
	a.held[ref] = true
	delete(a.gone, ref)
	delete(a.startGone, ref)
}

// startLook is the agent's first look at the declared files of its
// settled plan (lookAll), when its first plan settles, or at the first
// have or check after it: the files in place are noted (heldFile); those
// gone that no fill of this agent wrote yet are gone at its start
// (startGone: a reboot or a re-image emptied /run, or the node never
// held them), and those gone that a fill of it wrote were deleted since
// (look). It reports whether one is gone, for a have to say so at once.
// Called with a.mu held, a.root and a.settled set.
func (a *Agent) startLook() bool {
	a.lookAll = false
	found := false
	for _, row := range a.settled.Modules {
		if row.Build == "" {
			continue
		}
		for _, f := range row.Files {
			if !events.ValidPath(f.Path) {
				continue
			}
			ref := fileRef{row.Name, f.Path}
			err := lookFile(a.root, f.Path)
			switch {
			case err == nil:
				a.heldFile(ref)
			case !errors.Is(err, fs.ErrNotExist):
			case a.held[ref]:
				if a.look == nil {
					a.look = map[fileRef]bool{}
				}
				a.look[ref], found = true, true
			default:
				if a.startGone == nil {
					a.startGone, a.startReport = map[fileRef]bool{}, map[fileRef]bool{}
				}
				a.startGone[ref], a.startReport[ref], found = true, true, true
			}
		}
	}
	return found
}

// missingFiles returns the declared files of the settled plan that are
// missing on the node, of those it looks at: every file of a module that
// failed or restarted since its apply (it exited: a module crash-looping
// on a credential deleted on the node), every file checkFiles found gone
// under a module that runs on, every file the previous have reported
// missing, until it is back, and every file gone at the agent's start
// (startLook), until it is back. It reports those that were in place in
// this agent's life (a fill wrote or found them, or they were there at
// its first look): deleted there (a crash, an rm); and those gone at its
// start, marked so (events.MissingFile.AtStart; the have names the
// agent's claim). The have carries them (events.Have.Missing) and the
// reconciler asks the provisioner to refill those it saw filled, once
// per report, and once per agent start for those gone at the start (a
// fresh user's finding U21: the module crash-looped with nothing naming
// the file, and nothing refilled it until the provisioner's 10-minute
// resync). A file gone at the start was never filled (the settle's knock
// fills it: incident 1) or was lost with the node's /run (the agent-back
// knock refills every file): the reconciler counts only those a fill of
// another agent put there, and knocks once for the start, at the up or
// at this report (docs/architecture.md, "Files gone at the agent's
// start"). A held row that runs nothing is not looked at. The log says
// the set once per change.
func (a *Agent) missingFiles(mods []events.HaveModule) []events.MissingFile {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.root == nil || a.settled == nil {
		return nil
	}
	if a.lookAll {
		a.startLook()
	}
	exited := map[string]bool{}
	for _, m := range mods {
		if m.State == events.Failed || m.Restarts > 0 {
			exited[m.Name] = true
		}
	}
	var out []events.MissingFile
	gone := map[fileRef]bool{}
	for _, row := range a.settled.Modules {
		if row.Build == "" {
			continue
		}
		for _, f := range row.Files {
			ref := fileRef{row.Name, f.Path}
			if !exited[row.Name] && !a.gone[ref] && !a.look[ref] && !a.startGone[ref] && !a.startReport[ref] || !events.ValidPath(f.Path) {
				continue
			}
			err := lookFile(a.root, f.Path)
			switch {
			case err == nil:
				if a.startGone[ref] {
					a.heldFile(ref) // back, put there by another hand than a fill of this agent
				}
				if a.startReport[ref] {
					// Back (a fill, most often the agent-back knock's,
					// can land before the first have): that have says
					// still what the first look found, for the stream's
					// record; the reconciler knows the file back
					// (folder.missing: filled by this agent since).
					out = append(out, events.MissingFile{Module: row.Name, Path: f.Path, AtStart: true})
				}
			case !errors.Is(err, fs.ErrNotExist):
			case a.startGone[ref]:
				out = append(out, events.MissingFile{Module: row.Name, Path: f.Path, AtStart: true})
			case a.held[ref]:
				out = append(out, events.MissingFile{Module: row.Name, Path: f.Path})
				gone[ref] = true
			}
		}
	}
	a.gone = gone
	a.look = nil
	slices.SortFunc(out, func(x, y events.MissingFile) int {
		return cmp.Or(cmp.Compare(x.Module, y.Module), cmp.Compare(x.Path, y.Path))
	})
	out = slices.Compact(out)
	var said []string
	for _, m := range out {
		at := ""
		if m.AtStart {
			at = " (gone at the agent's start)"
		}
		said = append(said, m.Module+" "+m.Path+at)
	}
	if s := strings.Join(said, ", "); s != a.saidGone {
		a.saidGone = s
		if s != "" {
			a.log.Info("declared files missing on the node: the have reports them, and the reconciler asks the provisioner for those filled before", "files", s)
		}
	}
	return out
}

// startReported notes that a have carrying what the first look found
// gone (startReport) is stored: the next haves report those files only
// while they are gone.
func (a *Agent) startReported() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.startReport = nil
}

// checkLoop looks at the filled files in place on the node every
// CheckFiles (checkFiles) and publishes a have at once when one is gone,
// until ctx is done. Negative CheckFiles: it never looks.
func (a *Agent) checkLoop(ctx context.Context) {
	if a.cfg.CheckFiles < 0 {
		return
	}
	tick := time.NewTicker(a.cfg.CheckFiles)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if a.checkFiles() {
			a.kickHave()
		}
	}
}

// checkFiles looks (lookFile: fstatat, through the safe walk) at each declared file of the settled plan that
// was in place on the node in this agent's life and that no have reported
// missing yet, and returns whether one is gone: deleted under a module
// that runs on (an operator's rm, a cleanup cron, a tmpfs emptied), which
// no exit reveals, so missingFiles would not look at it and the module
// would meet its loss at its next read, or its next start, with nothing
// to refill it. The files gone are marked for the next have (look), which
// reports them; the reconciler then knocks once (reason missing) and the
// provisioner fills them again. A file reported once is not looked at
// here again until a have finds it back, so a file nobody refills costs
// one have, not one per interval. The agent's first look (startLook,
// lookAll) is its first settle's; should it be still to come, it is this
// one, and a file gone at the start makes a have too. The cost is one
// walk and fstatat per declared file, under the judging lock like a fill.
func (a *Agent) checkFiles() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.root == nil || a.settled == nil {
		return false
	}
	if a.lookAll {
		return a.startLook()
	}
	found := false
	for _, row := range a.settled.Modules {
		if row.Build == "" {
			continue
		}
		for _, f := range row.Files {
			ref := fileRef{row.Name, f.Path}
			if !a.held[ref] || a.gone[ref] || a.look[ref] || !events.ValidPath(f.Path) {
				continue
			}
			if err := lookFile(a.root, f.Path); errors.Is(err, fs.ErrNotExist) {
				if a.look == nil {
					a.look = map[fileRef]bool{}
				}
				a.look[ref] = true
				found = true
			}
		}
	}
	return found
}

// sweepTemps deletes the temporary files interrupted writes left beside
// every recorded file (an agent killed mid-write leaves one, holding the
// content). Called on start, before fills are served.
func (a *Agent) sweepTemps() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.root == nil {
		return
	}
	for _, paths := range a.loadFiles() {
		for _, p := range paths {
			if events.ValidPath(p) {
				a.sweepTemp(p)
			}
		}
	}
}

// sweepTemp deletes the temporary files of writes of p (see writeFile and
// atomicfile.IsTemp: .<base>.meshfold-<16 hex> in p's directory, resolved
// through the safe walk, sweepFile). Called with a.mu held, so no write
// is in flight.
func (a *Agent) sweepTemp(p string) {
	for range sweepFile(a.root, p) {
		a.log.Warn("deleted the temporary file of an interrupted write", "path", p)
	}
}

// watchRuntime publishes a have (at most one a HaveEvery) on every
// change a Supervisor runtime reports, until ctx is done. It looks at
// what runs at each: a check that fails and passes again between two
// haves restarts its module's held recovery (healthHold).
func (a *Agent) watchRuntime(ctx context.Context, sup Supervisor) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-sup.Changes():
			if mods, err := a.rt.Running(ctx); err == nil {
				a.health.observe(mods, time.Now())
			}
			select {
			case a.changeKick <- struct{}{}:
			default:
			}
		}
	}
}

// filledModule tells a Supervisor runtime that one of module's files was
// written.
func (a *Agent) filledModule(ctx context.Context, module string) {
	if sup, ok := a.rt.(Supervisor); ok {
		sup.Filled(ctx, module)
	}
}

// EndpointLogs is the agent's logs endpoint, on
// $MESHFOLD.<prefix>.logs.<node> (events.StateSubject): a subject the
// stream does not capture, which only the operator role may request.
const EndpointLogs = events.EndpointLogs

// LogsRequest is the body of a logs request.
type LogsRequest struct {
	Module string `json:"module"`
	LogQuery
}

// LogsReply is the reply: a page of the module's output, or an error.
// NoModule is set with Error when the runtime holds no module of that
// name (ErrNoModule), so that the asker can tell a mistyped module from
// a failure.
type LogsReply struct {
	LogPage
	Error    string `json:"error,omitempty"`
	NoModule bool   `json:"no_module,omitempty"`
}

// LogsSubject is the subject of node's logs endpoint under prefix.
func LogsSubject(prefix, node string) string {
	return events.StateSubject(prefix, EndpointLogs, node)
}

// maxLogRequests bounds the logs requests served at once (each may wait
// up to MaxLogWait for new output).
const maxLogRequests = 8

// addLogs registers the logs endpoint on svc.
func (a *Agent) addLogs(ctx context.Context, svc micro.Service) error {
	subject := LogsSubject(a.subj.Prefix, a.cfg.Name)
	busy := make(chan struct{}, maxLogRequests)
	return svc.AddEndpoint(EndpointLogs, store.CoreRequestsOnly(micro.HandlerFunc(func(req micro.Request) {
		select {
		case busy <- struct{}{}:
		default:
			_ = req.RespondJSON(LogsReply{Error: "too many logs requests at once; try again"})
			return
		}
		go func() {
			defer func() { <-busy }()
			_ = req.RespondJSON(a.serveLogs(ctx, req.Data()))
		}()
	}), a.dropped), micro.WithEndpointSubject(subject))
}

func (a *Agent) serveLogs(ctx context.Context, body []byte) LogsReply {
	var q LogsRequest
	if err := json.Unmarshal(body, &q); err != nil {
		return LogsReply{Error: "bad logs request: " + err.Error()}
	}
	if !events.ValidName(q.Module) {
		return LogsReply{Error: fmt.Sprintf("bad logs request: module %q: %v", q.Module, events.ErrBadName)}
	}
	lr, ok := a.rt.(LogReader)
	if !ok {
		return LogsReply{Error: "this node's runtime captures no output (it starts no process)"}
	}
	q.WaitMS = min(max(q.WaitMS, 0), int(MaxLogWait/time.Millisecond))
	page, err := lr.Logs(ctx, q.Module, q.LogQuery)
	if err != nil {
		return LogsReply{Error: err.Error(), NoModule: errors.Is(err, ErrNoModule)}
	}
	if page.Lines == nil {
		page.Lines = []string{}
	}
	return LogsReply{LogPage: page}
}
