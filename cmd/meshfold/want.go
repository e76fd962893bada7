package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/tracing"
	"github.com/meshfold/meshfold/node/bundle"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/store"
)

func init() { register(newWantCmd) }

type wantOpts struct {
	file   string
	expect uint64
	dryRun bool
	// allowMissing publishes a bundle build the builds bucket lacks.
	allowMissing bool
	// force publishes on a target of a running rollout.
	force bool
	// newNode publishes the first want of a node the stream holds no
	// event of.
	newNode bool
	out     outputFlag
	timeout time.Duration
}

func newWantCmd(a *app) *cobra.Command {
	var o wantOpts
	cmd := &cobra.Command{
		Use:   "want NODE -f FILE",
		Short: "Publish what NODE should run (a want), from a JSON file",
		Long: `want publishes a want for NODE: its full declaration of modules. A new want
replaces the old one; a module absent from it is to be removed.

FILE (or - for stdin) is one JSON object as DESIGN.md §3 describes:

  {"modules": [
    {"name": "provisioner", "build": "src2:9f1c", "runs_as": "prov", "provisioner": true},
    {"name": "mesh-build-go", "build": "src2:77aa", "runs_as": "mbg",
     "files": [{"path": "/run/mesh-build-go/broker.creds", "mode": "0600"}]},
    {"name": "nats", "build": "img:2.10", "runs_as": "nats", "requires_approval": true}
  ]}

"v" and "at" may be left out: v defaults to this build's schema version (1)
and at to the current time in UTC. When present they are kept and checked
(an at more than 5 minutes ahead of this machine's clock is said in a note).
Unknown fields are refused (a typo is an error, not a dropped field), and so
is anything DESIGN.md §3 forbids (bad names, relative paths, bad modes, two
provisioners, a path declared twice, a runs_as that is no Unix user name, a
path in the node agent's /.meshfold, a control character in a name, build or
path) and anything over the limits of DESIGN.md §10: ` + wantLimits + `; the error names the field and
the limit. Nothing is published unless the whole want is valid.

--expect SEQ publishes only if the newest want of NODE is at stream sequence
SEQ (0: NODE has no want yet), so two controllers cannot overwrite each other
blindly. A stale --expect fails with exit code 3 and says which sequence is
current.

On success it prints the stream sequence of the stored want. A node the
stream holds no event of (no agent has reported, nothing was published to it)
is refused, exit 2, nothing published: a mistyped name would make a phantom
node that 'meshfold fleet' lists as needing an operator. Start the node's agent
first (it reports at once), or give --new: the want creates the node, and says
so on stderr. --dry-run refuses the same, as the want itself would.

A build is a bundle's, sha256: and 64 lowercase hex digits (what 'meshfold
build push PATH' prints), or another runtime's <scheme>:<id> ("img:2.10").
A build of neither form ("garbage", a bundle's name, a digest cut short), or
nearly a bundle build (a slip of its scheme, "sh256:…", "SHA256:…", or a
bundle's 64 hex digits under another scheme) is refused with exit 2,
whatever the flags. A bundle build that is not in the
builds bucket (<stream>_BUILDS) is refused with exit 1: push it first.
Each refusal names the module, the build and the stored builds nearest to it.
--allow-missing-build publishes a bundle build not pushed yet (the node's
apply fails until it is there, and the node retries it, 1 s doubling to
1 min, so it settles within a minute of the push). --dry-run checks the same.
Once published, the builds are checked again: one removed meanwhile (a
'meshfold build rm' run beside the want) is said, exit 1: push it again.
A build that is no bundle build (not sha256:…, say "img:1") is published with
a note on stderr: the process runtime, meshfold node's default, cannot run it
(its apply fails); only an agent run with --runtime record takes it.
A want that declares files but has no provisioner module is published (and
passes --dry-run) with a warning on stderr: its plan names no provisioner
account, so the node accepts no write of those files and nothing fills them.

A node that a fleet's running rollout targets (DESIGN.md §11) is refused,
exit 3, nothing published: a want by hand there is a conflict, which halts
the rollout (and with auto_revert gives every changed target its previous
want back); during a revert it refuses the node's revert. The refusal names
the fleet and the rollout: let it finish, abort it, or give --force to take
the node by hand anyway. --dry-run refuses the same.

--dry-run publishes nothing: it prints the plan the reconciler would emit now
for this want, and its difference from the last plan emitted (modules added,
removed, changed; what is held and why), computed by the reconciler's own
Compose from the node's current state: the reconciler's (its state service),
else the stored snapshot, else its events folded from the stream. It prints
the sequence that state was folded through and the newest want's, to pin
with --expect when publishing. On stderr it notes a module with no runs_as
(an agent run as root refuses it; want notes that too) and a runs_as no
module of the node's newest plan runs as (the node may have no such user).
-o json or yaml prints the same as one document. The controller's creds may
dry-run (a CI job checks its want before publishing it); controller creds
issued before 5 December are refused it at once, told to issue them again.`,
		Example: `  meshfold want ace -f ace.json
  meshfold want newnode -f newnode.json --new   # before newnode's agent ever ran
  meshfold want ace -f ace.json --dry-run
  # {"modules":[{"name":"web","build":"garbage"}]}: refused, exit 2, naming
  # the stored builds nearest to it (meshfold build ls lists them all)
  meshfold want ace -f ace.json --expect 41
  RESTIC=$(meshfold build push ./restic)   # the module's bundle: a want names a pushed build
  jq --arg b "$RESTIC" '.modules += [{"name":"restic","build":$b,"runs_as":"backup"}]' ace.json | meshfold want ace -f -`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var expect *uint64
			if cmd.Flags().Changed("expect") {
				expect = &o.expect
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			return runWant(ctx, a, args[0], o, expect)
		},
		ValidArgsFunction: a.completeNodes(1),
	}
	fl := cmd.Flags()
	fl.StringVarP(&o.file, "file", "f", "", "the want as JSON; - reads stdin (required)")
	fl.Uint64Var(&o.expect, "expect", 0, "publish only if NODE's newest want is at this stream sequence (0: none yet)")
	addPublishTimeout(cmd, &o.timeout)
	fl.BoolVar(&o.allowMissing, "allow-missing-build", false, "publish a sha256: build the builds bucket does not hold (yet); a build of no build's form is refused still")
	fl.BoolVar(&o.newNode, "new", false, "publish the first want of a node the stream holds no event of (refused without it: a mistyped name would make a phantom node)")
	fl.BoolVar(&o.force, "force", false, "publish on a target of a running rollout (the rollout halts on it as a conflict; refused, exit 3, without it)")
	fl.BoolVar(&o.dryRun, "dry-run", false, "publish nothing: print the plan the reconciler would emit now and how it differs from the last")
	o.out.add(cmd, "")
	_ = cmd.MarkFlagRequired("file")
	a.conn.add(cmd)
	a.stream.add(cmd)
	return publishes(cmd, events.KindWant)
}

func runWant(ctx context.Context, a *app, nodeName string, o wantOpts, expect *uint64) error {
	file := o.file
	format, err := o.out.get()
	if err != nil {
		return err
	}
	if !events.ValidName(nodeName) {
		return withCode(exitUsage, &events.FieldError{Field: "NODE", Value: nodeName, Err: events.ErrBadName})
	}
	var data []byte
	if file == "-" {
		data, err = io.ReadAll(a.stdin)
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return withCode(exitUsage, fmt.Errorf("--file: %w", err))
	}
	if len(data) > events.MaxEventBytes {
		return withCode(exitUsage, fmt.Errorf("%s: %d bytes: a want is at most %d bytes (events.MaxEventBytes); nothing was published",
			fileLabel(file), len(data), events.MaxEventBytes))
	}
	now := time.Now()
	w, err := decodeWant(data, now)
	if pe := (*jsonPosError)(nil); errors.As(err, &pe) {
		return withCode(exitUsage, fmt.Errorf("%s:%w", fileLabel(file), err)) // file:LINE:COLUMN: …
	}
	if err != nil {
		return withCode(exitUsage, fmt.Errorf("%s: %w", fileLabel(file), err))
	}
	if note := aheadNote(w.At, now); note != "" {
		fmt.Fprintf(a.stderr, "note: %s: %s\n", fileLabel(file), note)
	}
	if o.dryRun {
		if expect != nil {
			return withCode(exitUsage, errors.New("--dry-run publishes nothing: --expect has nothing to guard"))
		}
		return runDryRun(ctx, a, nodeName, w, format, 2*time.Second, o.allowMissing, o.newNode, o.force)
	}

	nc, js, pub, err := a.openPublisher(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	r, err := a.stream.reader(nc, query.Config{})
	if err != nil {
		return err
	}
	// A want is how a node comes to be, but only on purpose (--new): a
	// mistyped name is refused, as every verb refuses one (issue 25; the
	// exit code table).
	known, err := knownNode(ctx, a, r, nodeName, o.newNode)
	if err != nil {
		return err
	}
	if err := checkBuilds(ctx, r, w, o.allowMissing); err != nil {
		return err
	}
	if !o.force {
		if err := refuseRolloutTarget(ctx, js, a, nodeName, false); err != nil {
			return err
		}
	}
	wantChecked()
	var opts []store.AppendOpt
	if expect != nil {
		opts = append(opts, store.WithExpectLastSubjectSeq(*expect))
	}
	ack, err := a.publishWant(ctx, pub, nodeName, w, opts)
	if errors.Is(store.ServerError(err), store.ErrConflict) {
		cur := "unknown"
		if seq, lerr := a.lastSeq(ctx, js, nodeName, events.KindWant); lerr == nil {
			cur = strconv.FormatUint(seq, 10)
		}
		return withCode(exitConflict, fmt.Errorf("conflict: --expect %d is stale: the newest want of %s is at sequence %s (someone published since); nothing was published — read it (meshfold audit %s) and retry with --expect %s",
			*expect, nodeName, cur, nodeName, cur))
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "want %s: stream sequence %d\n", nodeName, ack.Seq)
	if !o.allowMissing {
		if err := removedMeanwhile(ctx, r, w); err != nil {
			return err
		}
	}
	if note := notBundleNote(w); note != "" {
		fmt.Fprintln(a.stderr, note)
	}
	warnUnfillable(a.stderr, w)
	if notes := runsAsNotes(w, nil, nodeName); len(notes) > 0 {
		fmt.Fprintln(a.stderr, notes[0]) // the missing runs_as; the dry run also names accounts new to the node
	}
	if known == 0 {
		fmt.Fprintf(a.stderr, "note: created node %s: the stream held no event of it before (a mistyped name? 'meshfold retire %s --force --by NAME' forgets it: no agent will ever settle its plan)\n", nodeName, nodeName)
	}
	return nil
}

// wantChecked runs between want's check of its builds and its publish:
// tests remove a build there as a concurrent 'build rm' would.
var wantChecked = func() {}

// removedMeanwhile re-reads, once w is published, whether its bundle
// builds are still stored (query.Reader.MissingBuilds): a 'meshfold build
// rm' run beside the want may have removed one after the want's check
// and before its publish, and rm's own re-read may have run before the
// publish. Each side writes, then reads what the other wrote, so one of
// them says it (docs/architecture.md, "build rm's window"). Exit 1, as a
// want of a build not stored is refused; nil when the read fails.
func removedMeanwhile(ctx context.Context, r *query.Reader, w *events.Want) error {
	missing, err := r.MissingBuilds(ctx, w)
	if err != nil || len(missing) == 0 {
		return nil
	}
	var b strings.Builder
	for _, m := range missing {
		fmt.Fprintf(&b, "\n  module %s, build %s: %v", m.Module, m.Build, m.Err)
	}
	was := "a build was"
	if len(missing) > 1 {
		was = fmt.Sprintf("%d builds were", len(missing))
	}
	return fmt.Errorf("published, but %s removed meanwhile (a 'meshfold build rm' beside this command):%s\n"+
		"the node fails to fetch it with \"no such bundle\": push it again ('meshfold build push PATH' of the same content gives the same build)",
		was, b.String())
}

// refuseRolloutTarget refuses (exit 3) a want by hand on node while a
// fleet's rollout targets it and would halt on it (rollout.State.HandWant;
// a fresh user's finding 3: the want was published silently and the
// whole rollout halted and reverted), naming the rollout and how to go
// on, as apply refuses another fleet's nodes. It reads only the fleets
// whose newest rollout names node.
func refuseRolloutTarget(ctx context.Context, js jetstream.JetStream, a *app, node string, dryRun bool) error {
	stream, scfg, err := a.stream.openStream(ctx, js)
	if err != nil {
		return err
	}
	subj := scfg.Subjects()
	fleets, err := feed.Fleets(ctx, stream, subj)
	if err != nil {
		return err
	}
	for _, f := range fleets {
		_, nodes, err := feed.StartNodes(ctx, stream, subj, f)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(nodes, func(n rollout.NodeAtStart) bool { return n.Node == node && n.Want > 0 }) {
			continue
		}
		s, err := feed.Replay(ctx, js, scfg, nil, f)
		if err != nil {
			return fmt.Errorf("reading fleet %s's rollout: %w", f, err)
		}
		why := s.HandWant(node)
		if why == "" {
			continue
		}
		lead := "refused"
		if dryRun {
			lead = "refused (want would refuse it too)"
		}
		return withCode(exitConflict, fmt.Errorf("%s: %s; nothing was published\n"+
			"let the rollout finish ('meshfold rollout status %s'), abort it ('meshfold rollout abort %s --by NAME': its targets keep the wants they have), or take the node by hand anyway with --force",
			lead, why, f, f))
	}
	return nil
}

// knownNode returns how many events the stream holds of node
// (query.Reader.Count), and refuses (exit 2) a node it holds none of
// unless newNode (--new) or the reconciler's state holds it (stateKnows:
// its events aged out; counted as 1).
func knownNode(ctx context.Context, a *app, r *query.Reader, node string, newNode bool) (int, error) {
	known, err := r.Count(ctx, node)
	if err != nil {
		return 0, err
	}
	if known == 0 && !newNode {
		// Asked only without --new, which needs no answer. A
		// controller's creds may not ask the reconciler's state (the
		// operator roles may): the ask then reads as unknown and says
		// so (stateKnows).
		if _, ok := a.stateKnows(ctx, r, node); ok {
			return 1, nil // its events aged out (--max-age): no new node
		}
		cfg, _ := r.Stream(ctx)
		return 0, withCode(exitUsage, fmt.Errorf("node %s has no event in stream %s: nothing published (is the name mistyped? 'meshfold fleet --all' lists the nodes). Start its agent first ('meshfold node %s': it reports at once), or give --new to publish its first want anyway",
			node, cfg.Name, node))
	}
	return known, nil
}

// warnUnfillable warns of the files w declares that no write can fill,
// w having no provisioner module (reconcile.Unfillable; a fresh user's
// finding U25): dry run or not, as apply does.
func warnUnfillable(out io.Writer, w *events.Want) {
	for _, u := range reconcile.Unfillable(w.Modules) {
		fmt.Fprintln(out, "warning: "+u)
	}
}

// notBundleNote says which modules of w name a build that is no bundle
// build (sha256:…): the process runtime, meshfold node's default, runs
// only those, so such a node's apply fails; "" when every build is one.
// It is a note, not a refusal: an agent run with --runtime record (and
// any runtime of one's own) takes any build.
func notBundleNote(w *events.Want) string {
	var mods []string
	n := 0
	for _, m := range w.Modules {
		if !strings.HasPrefix(m.Build, bundle.BuildScheme) {
			n++
			if len(mods) < notBundleNamed {
				mods = append(mods, fmt.Sprintf("%s (%s)", m.Name, events.Text(m.Build)))
			}
		}
	}
	if n == 0 {
		return ""
	}
	list := strings.Join(mods, ", ")
	if n > len(mods) {
		// Each module named on one line made a 5 kB line of a want of 32
		// modules (a fresh user's finding V10): the first few, and where
		// the rest are.
		list += fmt.Sprintf(" and %d more (every module of the want whose build does not begin %s)", n-len(mods), bundle.BuildScheme)
	}
	return fmt.Sprintf("note: %s: no bundle build (%s…): the process runtime (meshfold node's default) runs only builds 'meshfold build push PATH' prints, and its apply of this want will fail; only an agent run with --runtime record takes such a build",
		list, bundle.BuildScheme)
}

// notBundleNamed is how many modules notBundleNote names.
const notBundleNamed = 3

// runsAsNotes says, as notes for stderr, which modules of w have no
// runs_as (an agent run as root refuses them: node/process.ErrNoRunsAs),
// then, when runs is not nil (the node's newest plan's rows), which
// runs_as accounts no module of that plan runs as: the agent looks each up
// on the node when it applies, and a node without that user fails the
// apply. Nothing when there is nothing to say. The CLI cannot see the
// node's users: the second note is a warning of where to look, not a
// refusal.
func runsAsNotes(w *events.Want, runs []events.PlanModule, node string) []string {
	var notes, none []string
	known := map[string]bool{}
	for _, m := range runs {
		known[m.RunsAs] = true
	}
	fresh := map[string][]string{}
	var order []string
	for _, m := range w.Modules {
		switch {
		case m.RunsAs == "":
			none = append(none, events.Text(m.Name))
		case runs != nil && !known[m.RunsAs]:
			if _, ok := fresh[m.RunsAs]; !ok {
				order = append(order, m.RunsAs)
			}
			fresh[m.RunsAs] = append(fresh[m.RunsAs], events.Text(m.Name))
		}
	}
	if len(none) > 0 {
		notes = append(notes, fmt.Sprintf(`note: %s no runs_as: an agent run as root refuses %s (its apply fails: it runs no module as root unless the want says "runs_as":"root"); an agent run as a normal user runs %s as that user`,
			strings.Join(none, ", ")+map[bool]string{true: " has", false: " have"}[len(none) == 1],
			map[bool]string{true: "it", false: "them"}[len(none) == 1], map[bool]string{true: "it", false: "them"}[len(none) == 1]))
	}
	for _, acct := range order {
		notes = append(notes, fmt.Sprintf("note: runs_as %s (%s) is new on %s: no module of its newest plan runs as %s; the agent looks the user up when it applies, and a node without it fails the apply ('no such user %s on this node')",
			events.Text(acct), strings.Join(fresh[acct], ", "), node, events.Text(acct), events.Text(acct)))
	}
	return notes
}

func fileLabel(file string) string {
	if file == "-" {
		return "stdin"
	}
	return file
}

// aheadSlack is how far ahead of this machine's clock a want's at may be
// without a note: more than clocks drift apart, less than a slip of the
// year or the hour.
const aheadSlack = 5 * time.Minute

// aheadNote says when a want's at is more than aheadSlack ahead of now
// (a fresh user's finding L11: "at": "2036-01-01T00:00:00Z" was taken
// without a word); "" otherwise. at is informational (DESIGN.md §3: the
// stream's time orders and dates events), so the want is still taken.
func aheadNote(at, now time.Time) string {
	ahead := at.Sub(now)
	if ahead <= aheadSlack {
		return ""
	}
	return fmt.Sprintf("\"at\" %s is %s ahead of this machine's clock; it is kept as written, informational (the stream's time orders and dates events); leave \"at\" out to have it filled in with now",
		at.UTC().Format(time.RFC3339), ahead.Round(time.Minute))
}

// decodeWant reads a user's want: one JSON object, v and at filled in when
// absent (v = events.Version, at = now), then decoded strictly (unknown
// fields refused) and validated. Errors name the field.
func decodeWant(data []byte, now time.Time) (*events.Want, error) {
	if err := noDuplicateKeys(data); err != nil {
		return nil, err
	}
	var obj map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&obj); err != nil {
		err = fmt.Errorf("not a JSON object: %w", err)
		if t := bytes.TrimSpace(data); len(t) > 0 && t[0] != '{' && t[0] != '[' {
			err = fmt.Errorf(`%w (want -f takes JSON, {"modules": [...]}; YAML is what apply's fleet files take)`, err)
		}
		return nil, atJSONOffset(data, err)
	}
	if obj == nil {
		return nil, errors.New("not a JSON object: null")
	}
	if dec.More() {
		return nil, errors.New("trailing data after the JSON object")
	}
	if _, ok := obj["v"]; !ok {
		obj["v"] = json.RawMessage(strconv.Itoa(events.Version))
	}
	if _, ok := obj["at"]; !ok {
		at, _ := json.Marshal(now.UTC().Truncate(time.Microsecond))
		obj["at"] = at
	}
	filled, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	p, err := events.DecodeStrict(events.KindWant, filled)
	if fe := (*events.FieldError)(nil); errors.As(err, &fe) && fe.Field == "modules" && errors.Is(err, events.ErrMissing) {
		// A want replaces the last one: no modules removes every module
		// from the node. That must be said, never implied by a forgotten
		// or misspelt key (events refuses it too).
		return nil, &events.FieldError{Field: "modules", Err: fmt.Errorf("%w (write \"modules\": [] to remove every module)", events.ErrMissing)}
	}
	if err != nil {
		// The object decoded was filled in (v, at): a type error's offset
		// is found again in the file's own bytes.
		var te *json.UnmarshalTypeError
		if e := json.NewDecoder(bytes.NewReader(data)).Decode(new(events.Want)); errors.As(e, &te) {
			return nil, atOffset(data, te.Offset, err)
		}
		return nil, err
	}
	w := p.(*events.Want)
	if err := events.CheckFileModes(w); err != nil {
		return nil, err
	}
	return w, nil
}

// jsonPosError is an error of a want file at a line and column (from 1,
// the column in runes): said as "LINE:COLUMN: …", after the file's name.
type jsonPosError struct {
	Line, Column int
	Err          error
}

func (e *jsonPosError) Error() string { return fmt.Sprintf("%d:%d: %v", e.Line, e.Column, e.Err) }
func (e *jsonPosError) Unwrap() error { return e.Err }

// atJSONOffset places err at the offset its json.SyntaxError names in
// data; err as it is without one.
func atJSONOffset(data []byte, err error) error {
	var se *json.SyntaxError
	if !errors.As(err, &se) {
		return err
	}
	return atOffset(data, se.Offset, err)
}

// atOffset places err at off in data, the offset encoding/json gives:
// just past the byte at fault.
func atOffset(data []byte, off int64, err error) error {
	off = max(0, min(off, int64(len(data))))
	before := data[:off]
	if off > 0 {
		before = data[:off-1]
	}
	line := bytes.Count(before, []byte("\n")) + 1
	col := utf8.RuneCount(before[bytes.LastIndexByte(before, '\n')+1:]) + 1
	return &jsonPosError{Line: line, Column: col, Err: err}
}

// noDuplicateKeys refuses a JSON document in which an object names a key
// twice: encoding/json keeps the last silently, so a want edited by hand
// could lose a module's field without a word (issue 25). The error names
// the key and where it is. A document that is not JSON, or nested deeper
// than encoding/json decodes (jsonMaxDepth), is left to the decoder's
// error. The walk keeps the path as a stack of its parts, joined only for
// the error: built at every level, a 200 KB file of nested brackets cost
// memory quadratic in its depth (a fresh user's finding: 7.8 GB after
// 10 minutes, never answered).
func noDuplicateKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var path []string // ".key" and "[i]" parts, from the top
	at := func() string {
		return cmp.Or(strings.TrimPrefix(strings.Join(path, ""), "."), "the top object")
	}
	var walk func() error
	walk = func() error {
		if len(path) > jsonMaxDepth {
			return errTooDeep
		}
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return err
				}
				k, _ := kt.(string)
				if seen[k] {
					return duplicateKey{fmt.Sprintf("%s: key %q appears twice (the last would silently win): write it once", at(), k)}
				}
				seen[k] = true
				path = append(path, "."+k)
				err = walk()
				path = path[:len(path)-1]
				if err != nil {
					return err
				}
			}
			_, err = dec.Token()
			return err
		case json.Delim('['):
			for i := 0; dec.More(); i++ {
				path = append(path, "["+strconv.Itoa(i)+"]")
				err := walk()
				path = path[:len(path)-1]
				if err != nil {
					return err
				}
			}
			_, err = dec.Token()
			return err
		}
		return nil
	}
	var dup duplicateKey
	if err := walk(); errors.As(err, &dup) {
		return dup
	}
	return nil
}

// jsonMaxDepth is how deep encoding/json decodes nested objects and
// arrays (its scanner's maxNestingDepth); deeper, its Decode fails with
// "exceeded max depth", which is the error a want that deep gets.
const jsonMaxDepth = 10000

// errTooDeep ends noDuplicateKeys' walk past jsonMaxDepth.
var errTooDeep = errors.New("nested too deep")

// duplicateKey is noDuplicateKeys' error.
type duplicateKey struct{ msg string }

func (e duplicateKey) Error() string { return e.msg }

// wantLimits lists the limits a want is checked against, for want's help.
var wantLimits = fmt.Sprintf("%d modules, %d\nfiles a module and %d a want, builds of %d bytes, paths of %d, accounts of\n%d, names of %d, and FILE of at most %d KiB",
	events.MaxModules, events.MaxFilesPerModule, events.MaxFilesPerWant, events.MaxBuild, events.MaxPath, events.MaxAccount, events.MaxName, events.MaxEventBytes>>10)

// addPublishTimeout adds --timeout, the time a verb that publishes takes
// at most: a cluster electing a leader is retried within it. 30 s by
// default: a crashed leader's bucket or stream took no write for up to
// 9.8 s (docs/operations.md, "Failover"), and the client's reconnect comes
// on top; 10 s gave up in an election (a fresh user's finding G5). The
// verb's reads of the stream before it publishes ride the election out
// within it too (store.RideOut; they had a fixed 10 s: finding V2).
func addPublishTimeout(cmd *cobra.Command, d *time.Duration) {
	cmd.Flags().DurationVar(d, "timeout", 30*time.Second, "give up publishing after this long (a cluster electing a leader after a server's crash, up to ~10 s, is waited out within it, the verb's reads of the stream as its publish)")
}

// addReadTimeout adds --timeout to a read verb (audit, rollout status,
// fleet): how long each of its requests to the stream waits out a
// cluster electing the stream's leader (store.WithRideOut), not a bound
// on the whole read. 30 s as the publishing verbs' (a fresh user's
// finding V3: they failed at a fixed 10 s with a bare "context deadline
// exceeded").
func addReadTimeout(cmd *cobra.Command, d *time.Duration) {
	cmd.Flags().DurationVar(d, "timeout", store.DefaultRideOut, "give up waiting for the stream's leader after this long (a cluster electing one after a server's crash, up to ~10 s, is waited out within it)")
}

// openPublisher connects with the command's flags and opens the existing
// stream. The caller closes the connection.
func (a *app) openPublisher(ctx context.Context) (*nats.Conn, jetstream.JetStream, *store.Publisher, error) {
	nc, js, err := a.connectJS("meshfold-cli")
	if err != nil {
		return nil, nil, nil, err
	}
	_, scfg, err := a.stream.openStream(ctx, js)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	return nc, js, store.NewPublisher(js, scfg.Subjects()), nil
}

// lastSeq returns the sequence of node's newest event of kind, 0 for none.
func (a *app) lastSeq(ctx context.Context, js jetstream.JetStream, node string, kind events.Kind) (uint64, error) {
	_, scfg, err := a.stream.openStream(ctx, js)
	if err != nil {
		return 0, err
	}
	// From the leader: the sequence a stale --expect is told to retry
	// with must be the newest acknowledged, which a replica behind the
	// leader may not have applied yet.
	m, err := store.LastMsg(ctx, store.Leader(js, scfg.Name), scfg.Subjects(), node, kind)
	if errors.Is(err, store.ErrNoMessage) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return m.Event.Seq, nil
}

// runDryRun prints what the reconciler would do now with w
// (query.Reader.DryRun: the state is the reconciler's, else the stored
// snapshot, else the node's events folded, else the empty state).
// Nothing is published.
func runDryRun(ctx context.Context, a *app, node string, w *events.Want, format string, timeout time.Duration, allowMissing, newNode, force bool) error {
	nc, err := a.conn.connect("meshfold-dry-run", a)
	if err != nil {
		return err
	}
	defer nc.Close()
	r, err := a.stream.reader(nc, query.Config{Timeout: timeout})
	if err != nil {
		return err
	}
	if _, err := knownNode(ctx, a, r, node, newNode); err != nil {
		return err
	}
	if err := checkBuilds(ctx, r, w, allowMissing); err != nil {
		return err
	}
	if !force {
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		if err := refuseRolloutTarget(ctx, js, a, node, true); err != nil {
			return err
		}
	}
	st, source, err := a.dryRunState(ctx, r, node)
	if err != nil {
		return err
	}
	d := st.DryRun(w.Modules)
	if note := notBundleNote(w); note != "" {
		fmt.Fprintln(a.stderr, note)
	}
	warnUnfillable(a.stderr, w)
	runs := reconcile.CompositionOf(st).Modules
	for _, note := range runsAsNotes(w, runs, node) {
		fmt.Fprintln(a.stderr, note)
	}
	if format != outTable {
		return writeValue(a.stdout, format, dryRunReply{Source: source, DryRun: d})
	}
	_, err = io.WriteString(a.stdout, audit.DryRunText(d, source.Text()))
	return err
}

// dryRunState is node's folded state a dry run composes from, and where
// it came from: the reconciler's (its state service's fold endpoint),
// else the stored snapshot and the node's events past it, else the
// node's events folded; a node nothing is known of is the empty state
// (query.SourceNone). The controller and operator roles may read each
// (store/auth). Creds that may not ask the fold endpoint (operator-read,
// or controller creds issued before the controller's dry run) read what
// is stored at once, not after the request's timeout: a refusal there,
// as the snapshot's for such controller creds, ends the command at once
// with the reason (explainDenied; a fresh user's finding M12: 2.3–15 s,
// then a denial that named no way on).
func (a *app) dryRunState(ctx context.Context, r *query.Reader, node string) (*reconcile.State, query.Source, error) {
	var (
		st     *reconcile.State
		source query.Source
	)
	before, denied, err := a.askState(ctx, func(ctx context.Context) (err error) {
		st, source, err = r.Fold(ctx, node)
		return err
	})
	if before != "" || (denied != "" && ctx.Err() == nil) {
		st, source, err = r.Stored(ctx, node)
	}
	if errors.Is(err, query.ErrUnknownNode) {
		return reconcile.NewState(node), query.SourceNone, nil
	}
	if err != nil {
		return nil, "", err
	}
	return st, source, nil
}

// checkBuilds refuses w when a module's build has no build's form
// (bundle.CheckForm: exit 2, even with allowMissing: such a build can
// never be pushed) or, unless allowMissing, when a bundle build is not
// in the builds bucket (query.Reader.MissingBuilds: exit 1), naming each
// with the stored builds nearest to it and how to go on.
func checkBuilds(ctx context.Context, r *query.Reader, w *events.Want, allowMissing bool) error {
	var missing []query.MissingBuild
	if allowMissing {
		seen := map[string]bool{}
		for _, m := range w.Modules {
			if seen[m.Build] {
				continue
			}
			seen[m.Build] = true
			if err := bundle.CheckForm(m.Build); err != nil {
				missing = append(missing, query.MissingBuild{Module: m.Name, Build: m.Build, Err: err})
			}
		}
	} else {
		var err error
		if missing, err = r.MissingBuilds(ctx, w); err != nil {
			return fmt.Errorf("checking the want's builds: %w", err)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, time.Second) // as listBuilds
	known, err := r.Builds(lctx)
	cancel()
	if err != nil {
		known = nil
	}
	var b strings.Builder
	malformed, unexplained := 0, 0
	for _, m := range missing {
		fmt.Fprintf(&b, "\n  module %s, build %s: %v", m.Module, m.Build, m.Err)
		b.WriteString(strings.ReplaceAll(nearestText(m.Build, known), "\n", "\n  "))
		if errors.Is(m.Err, bundle.ErrBadBuild) {
			malformed++
			// A build with no scheme, or nearly a bundle's, is told
			// what a build is in its own line already.
			if !errors.Is(m.Err, bundle.ErrNoScheme) && !errors.Is(m.Err, bundle.ErrNearlyBundle) {
				unexplained++
			}
		}
	}
	if malformed > 0 {
		// A build that does not parse is the command line's (the FILE's)
		// fault, exit 2, as 'meshfold build rm' says of the same build.
		what := "a build has"
		if malformed > 1 {
			what = fmt.Sprintf("%d builds have", malformed)
		}
		if unexplained == 0 {
			// Said once, not again as the last line (a fresh user's
			// finding L6).
			return withCode(exitUsage, fmt.Errorf("refused: %s no build's form; nothing was published:%s", what, b.String()))
		}
		return withCode(exitUsage, fmt.Errorf("refused: %s no build's form; nothing was published:%s\n"+
			"a build is either a bundle's, what 'meshfold build push PATH' prints (%s and 64 lowercase hex digits), or another runtime's <scheme>:<id> (img:2.10)",
			what, b.String(), bundle.BuildScheme))
	}
	return fmt.Errorf("refused: %s the node could not fetch; nothing was published:%s\npush each with 'meshfold build push PATH' (it prints the build), or publish anyway with --allow-missing-build",
		plural(len(missing), "build"), b.String())
}

// dryRunReply is what `want --dry-run -o json|yaml` prints.
type dryRunReply struct {
	// Source is where the state came from: "reconciler", "snapshot",
	// "stream" or "none" (nothing is known of the node yet).
	Source query.Source     `json:"source"`
	DryRun reconcile.DryRun `json:"dry_run"`
}

// publishWant publishes w for node. Traced (--otlp-endpoint or
// OTEL_EXPORTER_OTLP_ENDPOINT), the publish is the root span of the
// want's trace ("publish want"), whose traceparent the want carries to
// the reconciler, and the trace's id is told on stderr.
func (a *app) publishWant(ctx context.Context, pub *store.Publisher, node string, w *events.Want, opts []store.AppendOpt) (store.Ack, error) {
	log, err := a.logger()
	if err != nil {
		return store.Ack{}, err
	}
	tp, stopTracing, err := a.startTracing(ctx, "meshfold-want", log)
	if err != nil {
		return store.Ack{}, err
	}
	defer stopTracing()
	ctx, span := tracing.Start(ctx, tracing.Tracer(tp), "publish want", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(tracing.Node.String(node), tracing.Kind.String(string(events.KindWant))))
	defer span.End()
	// This build's want: its requires_approval flags set gates that only
	// an operator lifts (events.Want.Gates), whatever the file said.
	w.Gates = true
	ack, err := pub.AppendRetrying(ctx, node, w, append(opts, store.WithTraceparent(tracing.Traceparent(ctx)))...)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		return ack, err
	}
	span.SetAttributes(tracing.SeqAttr(tracing.Seq, ack.Seq))
	if sc := span.SpanContext(); sc.IsValid() {
		fmt.Fprintf(a.stderr, "trace %s\n", sc.TraceID())
	}
	return ack, nil
}
