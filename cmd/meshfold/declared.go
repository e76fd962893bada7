package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/editdist"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/store"
)

// A secret put, an approval, a revoke or a waive of a module or path that the
// node's newest want does not declare is refused (exit 2, nothing stored
// or published) unless --ahead says it is deliberate: a mistyped module
// or path would otherwise pass for a rotation, an approval or a paid
// item while the real one stays as it was (a fresh user's findings U4,
// U17). --new, which the same verbs take for a node the stream holds no
// event of, is about the node; --ahead keeps the node's own check.

// aheadFlagHelp is the --ahead flag's usage, what it stores or publishes
// ahead of.
func aheadFlagHelp(what string) string {
	return what + " ahead of the want: for a module or path the node's newest want does not declare (refused without it: a mistyped name)"
}

// wantDecl is the newest want of a node as the checks read it: seq 0
// and want nil when the node has none.
type wantDecl struct {
	node string
	seq  uint64
	want *events.Want
}

// newestWant reads node's newest want from the stream's leader (a want
// published a moment ago, the usual order, may not be applied by a
// replica yet).
func (a *app) newestWant(ctx context.Context, js jetstream.JetStream, node string) (wantDecl, error) {
	_, scfg, err := a.stream.openStream(ctx, js)
	if err != nil {
		return wantDecl{}, err
	}
	m, err := store.LastMsg(ctx, store.Leader(js, scfg.Name), scfg.Subjects(), node, events.KindWant)
	if errors.Is(err, store.ErrNoMessage) {
		return wantDecl{node: node}, nil
	}
	if err != nil {
		return wantDecl{}, fmt.Errorf("node %s: read its newest want: %w", node, err)
	}
	w, ok := m.Event.Payload.(*events.Want)
	if !ok {
		return wantDecl{}, fmt.Errorf("node %s: its newest want #%d does not decode as one", node, m.Event.Seq)
	}
	return wantDecl{node: node, seq: m.Event.Seq, want: w}, nil
}

// undeclared says why d does not declare module (path "": the module
// alone; else the file path of module): what the want declares instead,
// with "did you mean X?" when one of those is close. "" when it declares
// it.
func (d wantDecl) undeclared(module, path string) string {
	if d.want == nil {
		return fmt.Sprintf("node %s has no want yet, so none declares module %s", d.node, module)
	}
	var names []string
	for _, wm := range d.want.Modules {
		names = append(names, wm.Name)
		if wm.Name != module {
			continue
		}
		if path == "" || slices.ContainsFunc(wm.Files, func(f events.File) bool { return f.Path == path }) {
			return ""
		}
		var paths []string
		for _, f := range wm.Files {
			paths = append(paths, f.Path)
		}
		if len(paths) == 0 {
			return fmt.Sprintf("node %s's newest want (#%d) declares no file for module %s", d.node, d.seq, module)
		}
		return fmt.Sprintf("node %s's newest want (#%d) declares no file %s for module %s%s; it declares %s",
			d.node, d.seq, events.Text(path), module, didYouMean(path, paths), listNames(paths, events.Text))
	}
	if len(names) == 0 {
		return fmt.Sprintf("node %s's newest want (#%d) declares no module %s; it declares none", d.node, d.seq, module)
	}
	return fmt.Sprintf("node %s's newest want (#%d) declares no module %s%s; it declares %s",
		d.node, d.seq, module, didYouMean(module, names), listNames(names, func(s string) string { return s }))
}

// listNames joins up to 8 of names, each through quote, and says how many
// more there are.
func listNames(names []string, quote func(string) string) string {
	const show = 8
	var out []string
	for _, n := range names[:min(len(names), show)] {
		out = append(out, quote(n))
	}
	s := strings.Join(out, ", ")
	if len(names) > show {
		s += fmt.Sprintf(" and %d more", len(names)-show)
	}
	return s
}

// didYouMean is " (did you mean X?)" for the one of known nearest to s
// when it is near: an edit distance of at most 2, and below a third of
// s's length, or a case slip; "" when none is, or two are equally near.
func didYouMean(s string, known []string) string {
	best, bestD, tie := "", -1, false
	for _, k := range known {
		if k == s {
			continue
		}
		d := editdist.Distance(strings.ToLower(s), strings.ToLower(k))
		switch {
		case bestD < 0 || d < bestD:
			best, bestD, tie = k, d, false
		case d == bestD && k != best:
			tie = true
		}
	}
	if bestD < 0 || tie || bestD > 2 || bestD > 0 && 3*bestD > len(s) {
		return ""
	}
	return fmt.Sprintf(" (did you mean %s?)", events.Text(best))
}

// refuseUndeclared refuses (exit 2) an approval or a revoke (path "") or a waive of
// module on nodes whose newest want does not declare it. Named nodes are each checked;
// under all, only a module no node's want declares is refused (--all
// approves a module some nodes run). A waive of a file owed now, or
// declared by the node's newest plan (a want changed since), is taken:
// it pays something.
func (a *app) refuseUndeclared(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, kind events.Kind, nodes []string, all bool, module, path string) error {
	var whys []string
	for _, n := range nodes {
		d, err := a.newestWant(ctx, js, n)
		if err != nil {
			return err
		}
		why := d.undeclared(module, path)
		if why != "" && path != "" && a.waiveCovers(ctx, nc, n, module, path) {
			why = ""
		}
		if why == "" && all {
			return nil
		}
		if why != "" {
			whys = append(whys, why)
		}
	}
	if len(whys) == 0 {
		return nil
	}
	noun := map[events.Kind]string{events.KindApprove: "approval"}[kind]
	if noun == "" {
		noun = string(kind)
	}
	if all {
		return withCode(exitUsage, fmt.Errorf("%s --all: no node's newest want declares module %s: nothing published (is the name mistyped? --ahead publishes the %s ahead of a want that declares it)", kind, module, noun))
	}
	return withCode(exitUsage, fmt.Errorf("%s: nothing published (is the name mistyped? --ahead publishes the %s ahead of a want that declares it)", strings.Join(whys, ";\n"), noun))
}

// waiveCovers says whether a waive of module's path on node pays or
// covers something now: an owed item of it, or a file of it the node's
// newest plan declares (query.Reader.State). False when the state cannot
// be read.
func (a *app) waiveCovers(ctx context.Context, nc *nats.Conn, node, module, path string) bool {
	r, err := a.stream.reader(nc, query.Config{})
	if err != nil {
		return false
	}
	ns, err := r.State(ctx, node)
	if err != nil {
		return false
	}
	if slices.ContainsFunc(ns.View.Owed, func(o events.Owed) bool { return o.Module == module && o.Path == path }) {
		return true
	}
	i := slices.IndexFunc(ns.Composition.Modules, func(m events.PlanModule) bool { return m.Name == module })
	return i >= 0 && slices.ContainsFunc(ns.Composition.Modules[i].Files, func(f events.File) bool { return f.Path == path })
}

// refuseUndeclaredPut refuses (exit 2) a secret put for a file node's
// newest want does not declare for module, saying what it declares; a
// want that cannot be read refuses it too (exit 1), as the check could
// not be made. --ahead skips it.
func (a *app) refuseUndeclaredPut(ctx context.Context, node, module, path string) error {
	nc, js, err := a.connectJS("meshfold-secret")
	if err != nil {
		return err
	}
	defer nc.Close()
	d, err := a.newestWant(ctx, js, node)
	if err != nil {
		return fmt.Errorf("%w: nothing stored (--ahead stores it without this check)", err)
	}
	why := d.undeclared(module, path)
	if why == "" {
		return nil
	}
	return withCode(exitUsage, fmt.Errorf("%s: nothing stored (is the name mistyped? --ahead stores the secret ahead of a want that declares it: it is filled once one does)", why))
}
