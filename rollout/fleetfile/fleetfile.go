package fleetfile

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

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
	Line   int
}

// Group is a group of modules and the labels that select its nodes.
type Group struct {
	Name string
	// Select are labels a node must all have; empty selects every node.
	Select  map[string]string
	Modules []events.WantModule
	Line    int
	// lines of each module, for errors.
	moduleLines []int
	modulesLine int
	selectLine  int
}

// Problem is one error or warning of a fleet file: where, which field,
// what.
type Problem struct {
	Line    int
	Field   string
	Err     error
	Warning bool
}

func (p Problem) Error() string {
	kind := "error"
	if p.Warning {
		kind = "warning"
	}
	return fmt.Sprintf("line %d: %s: %s: %v", p.Line, kind, p.Field, p.Err)
}

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
)

// Parse reads a fleet file. It returns the fleet and its warnings, or
// every error found (an Errors, each naming its line and field). The
// rollout block's defaults are not filled in: [rollout.Params.Resolve]
// applies them.
func Parse(data []byte) (*Fleet, []Problem, error) {
	if len(data) > MaxFileBytes {
		return nil, nil, Errors{{Line: 1, Field: "file", Err: ErrTooBig}}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, nil, Errors{{Line: yamlLine(err), Field: "file", Err: err}}
	}
	p := &parser{f: &Fleet{}}
	if len(doc.Content) == 0 {
		p.fail(1, "file", ErrMissing)
		return nil, nil, p.errs
	}
	p.top(doc.Content[0])
	if len(p.errs) == 0 {
		p.check()
	}
	if len(p.errs) > 0 {
		slices.SortStableFunc(p.errs, func(a, b Problem) int { return cmp.Compare(a.Line, b.Line) })
		return nil, nil, p.errs
	}
	return p.f, p.warns, nil
}

// yamlLine digs the line out of a YAML syntax error ("yaml: line 3: …").
func yamlLine(err error) int {
	s := err.Error()
	if i := strings.Index(s, "line "); i >= 0 {
		n := 0
		for _, c := range s[i+5:] {
			if c < '0' || c > '9' {
				break
			}
			n = n*10 + int(c-'0')
		}
		if n > 0 {
			return n
		}
	}
	return 1
}

type parser struct {
	f     *Fleet
	errs  Errors
	warns []Problem
}

func (p *parser) fail(line int, field string, err error) {
	p.errs = append(p.errs, Problem{Line: line, Field: field, Err: err})
}

// mapping walks a mapping node's keys, refusing those not in known.
func (p *parser) mapping(n *yaml.Node, field string, known []string, each func(key string, k, v *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		if n.Tag == "!!null" {
			return
		}
		p.fail(n.Line, field, fmt.Errorf("%w: want a mapping", ErrShape))
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if known != nil && !slices.Contains(known, k.Value) {
			p.fail(k.Line, join(field, k.Value), fmt.Errorf("%w (known: %s)", ErrUnknownField, strings.Join(known, ", ")))
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
		p.fail(n.Line, field, fmt.Errorf("%w: want a value", ErrShape))
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
					p.fail(v.Line, "fleet", fmt.Errorf("%s: %w", events.Short(s), events.ErrBadName))
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
				p.fail(n.Line, k, ErrMissing)
			}
		}
	}
}

func (p *parser) labels(n *yaml.Node, field string) map[string]string {
	out := map[string]string{}
	p.mapping(n, field, nil, func(key string, k, v *yaml.Node) {
		f := join(field, key)
		if key == "" || len(key) > events.MaxName || events.HasControl(key) {
			p.fail(k.Line, f, ErrLabel)
			return
		}
		if s, ok := p.scalar(v, f); ok {
			if len(s) > events.MaxName || events.HasControl(s) {
				p.fail(v.Line, f, ErrLabel)
				return
			}
			out[key] = s
		}
	})
	return out
}

func (p *parser) nodes(n *yaml.Node) {
	p.mapping(n, "nodes", nil, func(key string, k, v *yaml.Node) {
		if !events.ValidName(key) {
			p.fail(k.Line, "nodes."+key, events.ErrBadName)
			return
		}
		if slices.ContainsFunc(p.f.Nodes, func(o Node) bool { return o.Name == key }) {
			p.fail(k.Line, "nodes."+key, events.ErrDuplicate)
			return
		}
		p.f.Nodes = append(p.f.Nodes, Node{Name: key, Labels: p.labels(v, "nodes."+key), Line: k.Line})
	})
	if len(p.f.Nodes) > rollout.MaxNodes {
		p.fail(n.Line, "nodes", fmt.Errorf("%w: %d, the limit is %d (rollout.MaxNodes)", events.ErrTooMany, len(p.f.Nodes), rollout.MaxNodes))
	}
	slices.SortFunc(p.f.Nodes, func(a, b Node) int { return cmp.Compare(a.Name, b.Name) })
}

func (p *parser) groups(n *yaml.Node) {
	if n.Kind != yaml.SequenceNode {
		p.fail(n.Line, "groups", fmt.Errorf("%w: want a list", ErrShape))
		return
	}
	for i, g := range n.Content {
		field := fmt.Sprintf("groups[%d]", i)
		grp := Group{Line: g.Line, Select: map[string]string{}, selectLine: g.Line}
		named := false
		p.mapping(g, field, []string{"name", "select", "modules"}, func(key string, k, v *yaml.Node) {
			switch key {
			case "name":
				if s, ok := p.scalar(v, field+".name"); ok {
					if !events.ValidName(s) {
						p.fail(v.Line, field+".name", fmt.Errorf("%s: %w", events.Short(s), events.ErrBadName))
					}
					grp.Name, named = s, true
				}
			case "select":
				grp.Select, grp.selectLine = p.labels(v, field+".select"), k.Line
			case "modules":
				grp.modulesLine = k.Line
				p.modules(v, field+".modules", &grp)
			}
		})
		if !named {
			p.fail(g.Line, field+".name", ErrMissing)
		} else if slices.ContainsFunc(p.f.Groups, func(o Group) bool { return o.Name == grp.Name }) {
			p.fail(g.Line, field+".name", fmt.Errorf("%s: %w", grp.Name, events.ErrDuplicate))
		}
		p.f.Groups = append(p.f.Groups, grp)
	}
}

func (p *parser) modules(n *yaml.Node, field string, g *Group) {
	if n.Kind != yaml.SequenceNode {
		p.fail(n.Line, field, fmt.Errorf("%w: want a list", ErrShape))
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
					p.fail(v.Line, ff, fmt.Errorf("%w: want true or false", ErrShape))
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
		g.moduleLines = append(g.moduleLines, mn.Line)
	}
}

func (p *parser) files(n *yaml.Node, field string) []events.File {
	if n.Kind != yaml.SequenceNode {
		p.fail(n.Line, field, fmt.Errorf("%w: want a list", ErrShape))
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
				p.fail(v.Line, field, err)
				return
			}
			*target = a
		case "min_healthy", "healthy_deadline":
			d, err := time.ParseDuration(s)
			if err != nil || d < 0 || d > rollout.MaxDuration || (key == "healthy_deadline" && d == 0) {
				p.fail(v.Line, field, fmt.Errorf("%s: %w", strconv.Quote(s), rollout.ErrBadDuration))
				return
			}
			if key == "min_healthy" {
				r.MinHealthy = rollout.Duration(d).Ptr()
			} else {
				r.HealthyDeadline = rollout.Duration(d)
			}
		case "auto_revert":
			if err := v.Decode(&r.AutoRevert); err != nil {
				p.fail(v.Line, field, fmt.Errorf("%w: want true or false", ErrShape))
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
			line, field := g.Line, fmt.Sprintf("groups[%d]", gi)
			var fe *events.FieldError
			if errors.As(err, &fe) {
				field += "." + fe.Field
				var i int
				if _, e := fmt.Sscanf(fe.Field, "modules[%d]", &i); e == nil && i < len(g.moduleLines) {
					line = g.moduleLines[i]
				} else if g.modulesLine > 0 {
					line = g.modulesLine
				}
				err = fe.Err
				if fe.Value != "" {
					err = fmt.Errorf("%s: %w", events.Short(fe.Value), fe.Err)
				}
			}
			p.fail(line, field, err)
		}
		matched := false
		for _, n := range p.f.Nodes {
			if selects(g, n) {
				matched = true
				break
			}
		}
		if !matched {
			p.warns = append(p.warns, Problem{Line: g.selectLine, Field: fmt.Sprintf("groups[%d].select", gi), Err: ErrMatchesNone, Warning: true})
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
					p.fail(g.moduleLines[mi], fmt.Sprintf("groups[%d].modules[%d].name", gi, mi),
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
			p.fail(n.Line, "nodes."+n.Name, fmt.Errorf("its want (the union of its groups): %w", err))
		}
	}
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
