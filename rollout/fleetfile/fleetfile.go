package fleetfile

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
)

// MaxFileBytes bounds a fleet file: 100,000 nodes with a few labels each.
const MaxFileBytes = 16 << 20

// Fleet is a parsed fleet file.
type Fleet struct {
	// Name is the fleet's subject token.
	Name string
	// Nodes are the owned nodes, sorted by name.
	Nodes []Node
	// Groups are in the file's order.
	Groups  []Group
	Rollout rollout.Params
}

// Node is an owned node and its labels.
type Node struct {
	Name   string
	Labels map[string]string
	// Line and Column are where the node's name is in the file.
	Line, Column int
}

// Group is a group of modules and the labels that select its nodes.
type Group struct {
	Name string
	// Select are labels a node must all have; empty selects every node.
	Select  map[string]string
	Modules []events.WantModule
	// Line and Column are where the group begins in the file.
	Line, Column int
	// where each module, the modules and the selector are, for errors.
	moduleAt  []*yaml.Node
	modulesAt *yaml.Node
	selectAt  *yaml.Node
}

// Problem is one error or warning of a fleet file: where (Line and
// Column, from 1; Column 0 when only the line is known), which field,
// what.
type Problem struct {
	Line, Column int
	Field        string
	Err          error
	Warning      bool
}

// Error is "LINE:COLUMN: error: FIELD: what" (or "LINE: …" without a
// column), what a compiler says: prefixed with the file's name
// ([Problem.In]) an editor jumps to it.
func (p Problem) Error() string {
	kind := "error"
	if p.Warning {
		kind = "warning"
	}
	at := strconv.Itoa(p.Line)
	if p.Column > 0 {
		at += ":" + strconv.Itoa(p.Column)
	}
	return fmt.Sprintf("%s: %s: %s: %v", at, kind, p.Field, p.Err)
}

// In is the problem as file:LINE:COLUMN: error: FIELD: what.
func (p Problem) In(file string) string { return file + ":" + p.Error() }

// Unwrap returns the problem's error.
func (p Problem) Unwrap() error { return p.Err }

// Errors are every error of a fleet file, in the file's order.
type Errors []Problem

func (e Errors) Error() string {
	lines := make([]string, len(e))
	for i, p := range e {
		lines[i] = p.Error()
	}
	return strings.Join(lines, "\n")
}

// In is every problem as [Problem.In] says it, one a line.
func (e Errors) In(file string) string {
	lines := make([]string, len(e))
	for i, p := range e {
		lines[i] = p.In(file)
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns each problem.
func (e Errors) Unwrap() []error {
	out := make([]error, len(e))
	for i, p := range e {
		out[i] = p
	}
	return out
}

// Errors of a fleet file, besides events' validation errors.
var (
	ErrUnknownField = errors.New("unknown field")
	ErrMissing      = errors.New("required")
	ErrShape        = errors.New("wrong shape")
	ErrTwoGroups    = errors.New("module in two of the node's groups")
	ErrMatchesNone  = errors.New("selects no owned node")
	ErrTooBig       = fmt.Errorf("fleet file over %d bytes", MaxFileBytes)
	ErrLabel        = errors.New("must be 1 to 63 bytes without a control character")
	ErrSyntax       = errors.New("not YAML")
	ErrDuplicateKey = errors.New("key appears twice (the last would silently win): write it once")
)

// Options change what [ParseWith] accepts.
type Options struct {
	// AllowEmptyGroup makes a group whose selector matches no owned node
	// a warning. Without it such a group is an error (a fresh user's
	// finding U13: a selector typo, `role: wbe`, gave every node a want
	// without the group's modules, so the rollout removed them fleet-wide
	// behind one warning line); `meshfold apply --allow-empty-group` sets
	// it, for a group kept on purpose before its nodes are labelled.
	AllowEmptyGroup bool
}

// Parse reads a fleet file. It returns the fleet and its warnings, or
// every error found (an Errors, each naming its line and field). The
// rollout block's defaults are not filled in: [rollout.Params.Resolve]
// applies them. A group that selects no owned node is an error
// ([ErrMatchesNone]); [ParseWith] can allow it.
func Parse(data []byte) (*Fleet, []Problem, error) { return ParseWith(data, Options{}) }

// ParseWith is [Parse] with options.
func ParseWith(data []byte, o Options) (*Fleet, []Problem, error) {
	if len(data) > MaxFileBytes {
		return nil, nil, Errors{{Line: 1, Field: "file", Err: ErrTooBig}}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, nil, Errors{syntaxProblem(data, err)}
	}
	p := &parser{f: &Fleet{}, o: o}
	if len(doc.Content) == 0 {
		p.fail(1, "file", ErrMissing)
		return nil, nil, p.errs
	}
	p.top(doc.Content[0])
	if len(p.errs) == 0 {
		p.check()
	}
	if len(p.errs) > 0 {
		slices.SortStableFunc(p.errs, func(a, b Problem) int { return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column)) })
		return nil, nil, p.errs
	}
	return p.f, p.warns, nil
}

// syntaxProblem says where a YAML syntax error is, and what was
// expected there. yaml.v3 gives only a line, counted from where the
// construct that failed began and most often one short of it, and no
// column; the place is found instead as the shortest prefix of data that
// fails the same way (a binary search over the lines, then a walk along
// the line found): where an unclosed bracket or quote opened, the line
// whose indentation breaks the mapping, the tab.
func syntaxProblem(data []byte, err error) Problem {
	msg := syntaxMessage(err)
	line, col := locateSyntax(data, msg)
	e := fmt.Errorf("%w: %s", ErrSyntax, msg)
	for _, h := range syntaxHints {
		if strings.Contains(msg, h.problem) {
			e = fmt.Errorf("%w (%s)", e, h.hint)
			break
		}
	}
	return Problem{Line: line, Column: col, Field: "file", Err: e}
}

// syntaxHints say what a yaml.v3 syntax message means for a fleet file.
var syntaxHints = []struct{ problem, hint string }{
	{"did not find expected ',' or ']'", "a '[' list not closed by ']', or two items without a ',' between them"},
	{"did not find expected ',' or '}'", "a '{' mapping not closed by '}', or two entries without a ',' between them"},
	{"did not find expected key", "a line indented where a key of the mapping above it was expected: check its indentation"},
	{"tab character", "indent with spaces, never tabs"},
	{"found unexpected end of stream", "a quote or bracket opened here is never closed"},
	{"mapping values are not allowed", "a ': ' inside a plain value: quote the value"},
	{"could not find expected ':'", "a key without ': ' and a value"},
	{"did not find expected '-' indicator", "a list item not in line with the items above it"},
	{"did not find expected node content", "a value missing here: a '[' or '{' not closed, or a '-' or key with nothing after it"},
	{"cannot start any token", "a value starting with a reserved character (@ ` % or a tab): quote it"},
}

// syntaxMessage is a syntax error's message without "yaml: " and
// yaml.v3's "line N: ".
func syntaxMessage(err error) string {
	s := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(s, "line "); ok {
		if _, after, ok := strings.Cut(rest, ": "); ok {
			s = after
		}
	}
	return s
}

// locateSyntax returns where the shortest prefix of data that fails to
// parse with msg ends: line and column from 1 (the column in runes), or
// 1, 0 when no prefix fails that way.
func locateSyntax(data []byte, msg string) (line, col int) {
	fails := func(n int) bool {
		var doc yaml.Node
		err := yaml.Unmarshal(data[:n], &doc)
		return err != nil && syntaxMessage(err) == msg
	}
	starts := []int{0}
	for i, c := range data {
		if c == '\n' && i+1 < len(data) {
			starts = append(starts, i+1)
		}
	}
	end := func(l int) int {
		if l+1 < len(starts) {
			return starts[l+1]
		}
		return len(data)
	}
	if !fails(len(data)) {
		return 1, 0
	}
	lo, hi := 0, len(starts)-1 // the first line whose end fails
	for lo < hi {
		mid := (lo + hi) / 2
		if fails(end(mid)) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	// The column the same way: a parse a byte, as before, cost a parse
	// of the whole prefix per byte of a long line (a fresh user's 40 KB
	// line of nested brackets: over 10 minutes, never answered).
	first, last := starts[lo], end(lo)
	if !fails(last) {
		return lo + 1, 0
	}
	for first < last {
		mid := (first + last) / 2
		if fails(mid + 1) {
			last = mid
		} else {
			first = mid + 1
		}
	}
	return lo + 1, utf8.RuneCount(data[starts[lo] : first+1])
}

type parser struct {
	f     *Fleet
	o     Options
	errs  Errors
	warns []Problem
}

func (p *parser) fail(line int, field string, err error) {
	p.errs = append(p.errs, Problem{Line: line, Field: field, Err: err})
}

// failAt is fail at n's line and column.
func (p *parser) failAt(n *yaml.Node, field string, err error) {
	p.errs = append(p.errs, Problem{Line: n.Line, Column: n.Column, Field: field, Err: err})
}

// mapping walks a mapping node's keys, refusing those not in known.
func (p *parser) mapping(n *yaml.Node, field string, known []string, each func(key string, k, v *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		if n.Tag == "!!null" {
			return
		}
		p.failAt(n, field, fmt.Errorf("%w: want a mapping", ErrShape))
		return
	}
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if first, ok := seen[k.Value]; ok {
			// yaml.v3 keeps both in a node; a decoder keeps the last.
			p.failAt(k, join(field, k.Value), fmt.Errorf("%w (first at %d:%d)", ErrDuplicateKey, first.Line, first.Column))
			continue
		}
		seen[k.Value] = k
		if known != nil && !slices.Contains(known, k.Value) {
			p.failAt(k, join(field, k.Value), fmt.Errorf("%w (known: %s)", ErrUnknownField, strings.Join(known, ", ")))
			continue
		}
		each(k.Value, k, v)
	}
}

func join(field, key string) string {
	if field == "" {
		return key
	}
	return field + "." + key
}

func (p *parser) scalar(n *yaml.Node, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		p.failAt(n, field, fmt.Errorf("%w: want a value", ErrShape))
		return "", false
	}
	return n.Value, true
}

func (p *parser) top(n *yaml.Node) {
	seen := map[string]int{}
	p.mapping(n, "", []string{"fleet", "nodes", "groups", "rollout"}, func(key string, k, v *yaml.Node) {
		seen[key] = k.Line
		switch key {
		case "fleet":
			if s, ok := p.scalar(v, "fleet"); ok {
				if !events.ValidName(s) {
					p.failAt(v, "fleet", fmt.Errorf("%s: %w", events.Short(s), events.ErrBadName))
				}
				p.f.Name = s
			}
		case "nodes":
			p.nodes(v)
		case "groups":
			p.groups(v)
		case "rollout":
			p.rollout(v)
		}
	})
	if n.Kind == yaml.MappingNode {
		for _, k := range []string{"fleet", "nodes", "groups"} {
			if seen[k] == 0 {
				p.failAt(n, k, ErrMissing)
			}
		}
	}
}

// labels reads a mapping of labels: a node's (node is its name) or a
// selector's (node empty).
func (p *parser) labels(n *yaml.Node, field, node string) map[string]string {
	out := map[string]string{}
	p.mapping(n, field, nil, func(key string, k, v *yaml.Node) {
		f := join(field, key)
		if key == "" || len(key) > events.MaxName || events.HasControl(key) {
			p.failAt(k, f, ErrLabel)
			return
		}
		if node != "" && v.Kind != yaml.ScalarNode {
			// The Kubernetes habit, `bob: {labels: {role: web}}` (a
			// fresh user's finding U14: "wrong shape: want a value").
			p.failAt(v, f, nodeLabelsShape(node, key, v))
			return
		}
		if s, ok := p.scalar(v, f); ok {
			if len(s) > events.MaxName || events.HasControl(s) {
				p.failAt(v, f, ErrLabel)
				return
			}
			out[key] = s
		}
	})
	return out
}

// nodeLabelsShape is the error of a node's label whose value is no
// string: key "labels" is the Kubernetes habit, and the example is its
// own labels as this file writes them.
func nodeLabelsShape(node, key string, v *yaml.Node) error {
	example := "{role: web}"
	if key == "labels" && v.Kind == yaml.MappingNode && len(v.Content) > 0 {
		var pairs []string
		for i := 0; i+1 < len(v.Content); i += 2 {
			if k, val := v.Content[i], v.Content[i+1]; k.Kind == yaml.ScalarNode && val.Kind == yaml.ScalarNode {
				pairs = append(pairs, k.Value+": "+val.Value)
			}
		}
		if len(pairs) == len(v.Content)/2 {
			example = "{" + strings.Join(pairs, ", ") + "}"
		}
	}
	if key == "labels" {
		return fmt.Errorf("%w: a node's labels are its value: `%s: %s` (label values are strings; `labels:` is not a key)", ErrShape, node, example)
	}
	return fmt.Errorf("%w: want a value: a node's labels are its value, each a string: `%s: %s`", ErrShape, node, example)
}

func (p *parser) nodes(n *yaml.Node) {
	p.mapping(n, "nodes", nil, func(key string, k, v *yaml.Node) {
		if !events.ValidName(key) {
			p.failAt(k, "nodes."+key, events.ErrBadName)
			return
		}
		if slices.ContainsFunc(p.f.Nodes, func(o Node) bool { return o.Name == key }) {
			p.failAt(k, "nodes."+key, events.ErrDuplicate)
			return
		}
		p.f.Nodes = append(p.f.Nodes, Node{Name: key, Labels: p.labels(v, "nodes."+key, key), Line: k.Line, Column: k.Column})
	})
	if len(p.f.Nodes) > rollout.MaxNodes {
		p.failAt(n, "nodes", fmt.Errorf("%w: %d, the limit is %d (rollout.MaxNodes)", events.ErrTooMany, len(p.f.Nodes), rollout.MaxNodes))
	}
	slices.SortFunc(p.f.Nodes, func(a, b Node) int { return cmp.Compare(a.Name, b.Name) })
}

func (p *parser) groups(n *yaml.Node) {
	if n.Kind != yaml.SequenceNode {
		p.failAt(n, "groups", fmt.Errorf("%w: want a list", ErrShape))
		return
	}
	for i, g := range n.Content {
		field := fmt.Sprintf("groups[%d]", i)
		grp := Group{Line: g.Line, Column: g.Column, Select: map[string]string{}, selectAt: g}
		named := false
		p.mapping(g, field, []string{"name", "select", "modules"}, func(key string, k, v *yaml.Node) {
			switch key {
			case "name":
				if s, ok := p.scalar(v, field+".name"); ok {
					if !events.ValidName(s) {
						p.failAt(v, field+".name", fmt.Errorf("%s: %w", events.Short(s), events.ErrBadName))
					}
					grp.Name, named = s, true
				}
			case "select":
				grp.Select, grp.selectAt = p.labels(v, field+".select", ""), k
			case "modules":
				grp.modulesAt = k
				p.modules(v, field+".modules", &grp)
			}
		})
		if !named {
			p.failAt(g, field+".name", ErrMissing)
		} else if slices.ContainsFunc(p.f.Groups, func(o Group) bool { return o.Name == grp.Name }) {
			p.failAt(g, field+".name", fmt.Errorf("%s: %w", grp.Name, events.ErrDuplicate))
		}
		p.f.Groups = append(p.f.Groups, grp)
	}
}

func (p *parser) modules(n *yaml.Node, field string, g *Group) {
	if n.Kind != yaml.SequenceNode {
		p.failAt(n, field, fmt.Errorf("%w: want a list", ErrShape))
		return
	}
	for i, mn := range n.Content {
		f := fmt.Sprintf("%s[%d]", field, i)
		var m events.WantModule
		p.mapping(mn, f, []string{"name", "build", "runs_as", "files", "provisioner", "requires_approval", "hold"}, func(key string, k, v *yaml.Node) {
			ff := f + "." + key
			switch key {
			case "name", "build", "runs_as":
				s, ok := p.scalar(v, ff)
				if !ok {
					return
				}
				switch key {
				case "name":
					m.Name = s
				case "build":
					m.Build = s
				default:
					m.RunsAs = s
				}
			case "provisioner", "requires_approval", "hold":
				var b bool
				if err := v.Decode(&b); err != nil {
					p.failAt(v, ff, fmt.Errorf("%w: want true or false", ErrShape))
					return
				}
				switch key {
				case "provisioner":
					m.Provisioner = b
				case "requires_approval":
					m.RequiresApproval = b
				default:
					m.Hold = b
				}
			case "files":
				m.Files = p.files(v, ff)
			}
		})
		g.Modules = append(g.Modules, m)
		g.moduleAt = append(g.moduleAt, mn)
	}
}

func (p *parser) files(n *yaml.Node, field string) []events.File {
	if n.Kind != yaml.SequenceNode {
		p.failAt(n, field, fmt.Errorf("%w: want a list", ErrShape))
		return nil
	}
	var out []events.File
	for i, fn := range n.Content {
		f := fmt.Sprintf("%s[%d]", field, i)
		var file events.File
		p.mapping(fn, f, []string{"path", "mode"}, func(key string, k, v *yaml.Node) {
			// A mode is read as written: 0600 unquoted stays "0600".
			if s, ok := p.scalar(v, f+"."+key); ok {
				if key == "path" {
					file.Path = s
				} else {
					file.Mode = events.Mode(s)
				}
			}
		})
		out = append(out, file)
	}
	return out
}

func (p *parser) rollout(n *yaml.Node) {
	r := &p.f.Rollout
	at := map[string]*yaml.Node{}
	defer func() {
		if field, err := r.CheckTimes(); err != nil && at[field] != nil {
			p.failAt(at[field], "rollout."+field, err)
		}
	}()
	p.mapping(n, "rollout", []string{"batch", "max_unavailable", "canary", "min_healthy", "healthy_deadline", "auto_revert"}, func(key string, k, v *yaml.Node) {
		field := "rollout." + key
		s, ok := p.scalar(v, field)
		if !ok {
			return
		}
		switch key {
		case "batch", "max_unavailable", "canary":
			a, err := rollout.ParseAmount(s)
			var one rollout.Params
			target := &r.Batch
			switch key {
			case "batch":
				one.Batch = a
			case "max_unavailable":
				one.MaxUnavailable, target = a, &r.MaxUnavailable
			default:
				one.Canary, target = a, &r.Canary
			}
			if err == nil {
				err = one.Validate()
			}
			if err == nil && a.IsZero() && key != "canary" {
				err = fmt.Errorf("%s 0: %w", key, rollout.ErrBadAmount)
			}
			if err != nil {
				p.failAt(v, field, err)
				return
			}
			*target = a
		case "min_healthy", "healthy_deadline":
			d, err := time.ParseDuration(s)
			if err != nil || d < 0 || d > rollout.MaxDuration || (key == "healthy_deadline" && d == 0) {
				p.failAt(v, field, fmt.Errorf("%s: %w", strconv.Quote(s), rollout.ErrBadDuration))
				return
			}
			at[key] = v
			if key == "min_healthy" {
				r.MinHealthy = rollout.Duration(d).Ptr()
			} else {
				r.HealthyDeadline = rollout.Duration(d)
			}
		case "auto_revert":
			if err := v.Decode(&r.AutoRevert); err != nil {
				p.failAt(v, field, fmt.Errorf("%w: want true or false", ErrShape))
			}
		}
	})
}

// check validates what needs the whole file: each group's modules as a
// want's, each node's want (no module in two of its groups, the limits of
// a want), and selectors that match nothing.
func (p *parser) check() {
	for gi, g := range p.f.Groups {
		if err := rollout.CheckWant(g.Modules); err != nil {
			at, field := &yaml.Node{Line: g.Line, Column: g.Column}, fmt.Sprintf("groups[%d]", gi)
			var fe *events.FieldError
			if errors.As(err, &fe) {
				field += "." + fe.Field
				var i int
				if _, e := fmt.Sscanf(fe.Field, "modules[%d]", &i); e == nil && i < len(g.moduleAt) {
					at = g.moduleAt[i]
				} else if g.modulesAt != nil {
					at = g.modulesAt
				}
				err = fe.Err
				if fe.Value != "" {
					err = fmt.Errorf("%s: %w", events.Short(fe.Value), fe.Err)
				}
			}
			p.failAt(at, field, err)
		}
		matched := false
		for _, n := range p.f.Nodes {
			if selects(g, n) {
				matched = true
				break
			}
		}
		if !matched {
			pr := Problem{Line: g.selectAt.Line, Column: g.selectAt.Column, Field: fmt.Sprintf("groups[%d].select", gi), Err: ErrMatchesNone, Warning: true}
			if p.o.AllowEmptyGroup {
				p.warns = append(p.warns, pr)
			} else {
				pr.Warning, pr.Err = false, p.emptyGroup(g)
				p.errs = append(p.errs, pr)
			}
		}
	}
	if len(p.errs) > 0 {
		return
	}
	for _, n := range p.f.Nodes {
		from := map[string]int{} // module → group index
		for gi, g := range p.f.Groups {
			if !selects(g, n) {
				continue
			}
			for mi, m := range g.Modules {
				if first, ok := from[m.Name]; ok {
					p.failAt(g.moduleAt[mi], fmt.Sprintf("groups[%d].modules[%d].name", gi, mi),
						fmt.Errorf("%w: %s is in groups %s and %s of node %s", ErrTwoGroups, m.Name, p.f.Groups[first].Name, g.Name, n.Name))
					continue
				}
				from[m.Name] = gi
			}
		}
		if len(p.errs) > 0 {
			continue
		}
		if err := rollout.CheckWant(p.f.want(n)); err != nil {
			p.failAt(&yaml.Node{Line: n.Line, Column: n.Column}, "nodes."+n.Name, fmt.Errorf("its want (the union of its groups): %w", err))
		}
	}
}

// emptyGroup is the error of group g, which selects no owned node: what
// it would do (its modules in no node's want: a node running one has it
// removed) and, per label of its selector, what the owned nodes have
// instead (a typo shows), then how to say it is meant.
func (p *parser) emptyGroup(g Group) error {
	var mods []string
	for _, m := range g.Modules {
		mods = append(mods, m.Name)
	}
	what := "it gives no node anything"
	if len(mods) > 0 {
		what = fmt.Sprintf("its modules (%s) are in no node's want, so the rollout removes them from every node that runs them", strings.Join(mods, ", "))
	}
	var have []string
	for _, k := range slices.Sorted(maps.Keys(g.Select)) {
		var vals []string
		for _, n := range p.f.Nodes {
			if v, ok := n.Labels[k]; ok && !slices.Contains(vals, v) {
				vals = append(vals, v)
			}
		}
		switch {
		case len(vals) == 0:
			have = append(have, fmt.Sprintf("no owned node has a label %s", k))
		case !slices.Contains(vals, g.Select[k]):
			slices.Sort(vals)
			if len(vals) > 5 {
				vals = append(vals[:5], "…")
			}
			have = append(have, fmt.Sprintf("no owned node has %s: %s (they have %s: %s)", k, g.Select[k], k, strings.Join(vals, ", ")))
		}
	}
	if len(have) == 0 {
		have = append(have, "no owned node has all its labels")
	}
	return fmt.Errorf("%w: %s; %s: fix the selector or the nodes' labels, or, if the group is meant to select nothing yet, apply with --allow-empty-group",
		ErrMatchesNone, what, strings.Join(have, "; "))
}

// selects reports whether every label of g's selector is one of n's.
func selects(g Group, n Node) bool {
	for k, v := range g.Select {
		if n.Labels[k] != v {
			return false
		}
	}
	return true
}

// want is n's want: the modules of every group selecting it, sorted by
// name.
func (f *Fleet) want(n Node) []events.WantModule {
	out := []events.WantModule{}
	for _, g := range f.Groups {
		if selects(g, n) {
			out = append(out, g.Modules...)
		}
	}
	slices.SortStableFunc(out, func(a, b events.WantModule) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// Want returns node's want, the modules of every group whose selector
// it matches, sorted by name (an owned node that no group selects wants
// nothing: every module removed); ok is false for a node the fleet does
// not own.
func (f *Fleet) Want(node string) (modules []events.WantModule, ok bool) {
	i, found := slices.BinarySearchFunc(f.Nodes, node, func(n Node, name string) int { return cmp.Compare(n.Name, name) })
	if !found {
		return nil, false
	}
	return f.want(f.Nodes[i]), true
}
