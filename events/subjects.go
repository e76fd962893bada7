package events

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
)

// DefaultPrefix is the first token of every plain subject.
const DefaultPrefix = "mesh"

// DefaultPartitions is the default partition count N of the stream's
// subject transform (DESIGN.md §3). It is fixed for the stream's life.
const DefaultPartitions = 16

// Subjects builds and parses meshfold subjects for one prefix and
// partition count. The zero value uses [DefaultPrefix] and
// [DefaultPartitions].
//
// Plain form (what publishers use):  <prefix>.<node>.<kind>
// Stored form (what the stream holds): <p>.<prefix>.<node>.<kind>
// where p = FNV-1a-32(node) mod N.
// Named form (an operator event of a named operator, [Subjects.Named]):
// <p>.<prefix>.<node>.<kind>.<operator>, published and stored as is.
type Subjects struct {
	Prefix string
	// Partitions is the stream's partition count N (1..1024); 0 means
	// [DefaultPartitions]. Take it from the stream's effective
	// configuration: it is fixed for the stream's life.
	Partitions int
}

// N returns the partition count.
func (s Subjects) N() int {
	if s.Partitions <= 0 {
		return DefaultPartitions
	}
	return s.Partitions
}

func (s Subjects) prefix() string {
	if s.Prefix == "" {
		return DefaultPrefix
	}
	return s.Prefix
}

// ValidPrefix reports whether p can be a subject prefix: one token, a
// valid name.
func ValidPrefix(p string) bool { return ValidName(p) }

// Event returns the plain subject of node's events of kind k.
func (s Subjects) Event(node string, k Kind) string {
	return s.prefix() + "." + node + "." + string(k)
}

// Named returns the subject on which the operator named by publishes
// node's event of kind k (one of [OperatorKinds]):
// <p>.<prefix>.<node>.<kind>.<by>, the stored form with the operator's
// name as a fifth token. The publisher computes the partition p, as the
// stream's transform does for a plain subject (which has three tokens
// only); the server lets a named operator's credentials publish only
// subjects that end in its own name, so the name is one the server
// checked (docs/architecture.md, "Operators named in the subject"). A
// reader takes the name from the subject ([Subjects.ParseBy]).
func (s Subjects) Named(node string, k Kind, by string) string {
	return s.Stored(node, k) + "." + by
}

// NamedInput returns the patterns of the named operator events the
// stream captures, one per partition: <p>.<prefix>.*.*.*. They have five
// tokens, so the partition transform leaves them as they are. The
// partition token is spelled out: the server refuses a stream subject
// whose first token is a wildcard (it could overlap $JS.API, error
// 10052). Only named operators may publish five-token subjects there,
// and only of an operator kind ending in their name (store/auth). A
// stream captures them once an operator asked (store.CaptureNamed), not
// from its creation ([Subjects.Captured]).
func (s Subjects) NamedInput() []string {
	out := make([]string, s.N())
	for p := range out {
		out[p] = strconv.Itoa(p) + "." + s.prefix() + ".*.*.*"
	}
	return out
}

// Fill returns the subject of node's fill requests. No stream captures it:
// it carries secret content (DESIGN.md §3).
func (s Subjects) Fill(node string) string { return s.prefix() + "." + node + ".fill" }

// Input returns the plain subject patterns the stream captures, one per
// event kind: <prefix>.*.<kind>.
func (s Subjects) Input() []string {
	out := make([]string, len(Kinds))
	for i, k := range Kinds {
		out[i] = s.prefix() + ".*." + string(k)
	}
	return out
}

// Transform returns the stream's subject transform for the N
// partitions: every plain subject gets its partition token first.
func (s Subjects) Transform() (source, destination string) {
	return s.prefix() + ".*.*", fmt.Sprintf("{{partition(%d,1)}}.%s.{{wildcard(1)}}.{{wildcard(2)}}", s.N(), s.prefix())
}

// Partition returns node's partition among n: FNV-1a-32(node) mod n, the
// number the stream's transform computes.
func Partition(node string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(node))
	return int(h.Sum32() % uint32(n))
}

// Partition returns node's partition: [Partition] among the N.
func (s Subjects) Partition(node string) int { return Partition(node, s.N()) }

// Stored returns the stored subject of node's events of kind k. k "*" or
// ">" make a filter.
func (s Subjects) Stored(node string, k Kind) string {
	return strconv.Itoa(s.Partition(node)) + "." + s.prefix() + "." + node + "." + string(k)
}

// StoredNode returns the stored-subject filter of every event of node,
// named operator events included: <p>.<prefix>.<node>.>.
func (s Subjects) StoredNode(node string) string {
	return strconv.Itoa(s.Partition(node)) + "." + s.prefix() + "." + node + ".>"
}

// StoredPartition returns the stored-subject filters of partition p for the
// given kinds: <p>.<prefix>.*.<kind>, and for an operator kind also its
// named form, <p>.<prefix>.*.<kind>.*.
func (s Subjects) StoredPartition(p int, kinds ...Kind) []string {
	out := make([]string, 0, len(kinds))
	for _, k := range kinds {
		f := strconv.Itoa(p) + "." + s.prefix() + ".*." + string(k)
		out = append(out, f)
		if k.Operator() {
			out = append(out, f+".*")
		}
	}
	return out
}

// StoredKind returns the stored-subject filter of every node's events of
// kind k, all partitions: *.<prefix>.*.<k>. An operator kind's named
// events are [Subjects.StoredNamedKind]'s.
func (s Subjects) StoredKind(k Kind) string { return "*." + s.prefix() + ".*." + string(k) }

// StoredNamedKind returns the stored-subject filter of every named
// operator event of kind k, all partitions and operators:
// *.<prefix>.*.<k>.*.
func (s Subjects) StoredNamedKind(k Kind) string { return s.StoredKind(k) + ".*" }

// StoredPartitionAll returns the stored-subject filter of every event of
// partition p, named operator events included: <p>.<prefix>.*.>. One
// filter: the server serves it from its subject index.
func (s Subjects) StoredPartitionAll(p int) string {
	return strconv.Itoa(p) + "." + s.prefix() + ".*.>"
}

// FleetNode is the node token of the fleet-wide journal,
// <prefix>._fleet.journal: where the reconciler notes events whose subject
// names no valid node (so no node's journal can hold them). It is no
// valid node name, so no node can be called that; [Subjects.Parse]
// accepts it for the journal kind only.
const FleetNode = "_fleet"

// Parse splits a plain, stored or named subject into node and kind. The
// partition token, when there, is checked to be a number and dropped;
// a named subject's operator ([Subjects.ParseBy]) is checked and
// dropped.
//
// Errors: those of [Subjects.ParseBy].
func (s Subjects) Parse(subject string) (node string, kind Kind, err error) {
	node, kind, _, err = s.ParseBy(subject)
	return node, kind, err
}

// ParseBy is [Subjects.Parse] that also returns the operator a named
// subject ([Subjects.Named]) names: the name the server checked against
// the publisher's credentials; empty for a plain or stored subject, whose
// payload's `by` is self-declared.
//
// Errors: ErrBadSubject when the subject has another shape or prefix or an
// invalid node name ([FleetNode] is taken for the journal kind only), and
// for a named subject whose kind is no operator kind, whose operator is
// no valid name, or whose partition token is not the node's partition
// (the stream's transform puts a plain subject in its node's partition;
// a named one's publisher does, and one that did not would have its
// event folded apart from the node's others); ErrUnknownKind for an
// unknown kind token. Errors quote the subject through [Short].
func (s Subjects) ParseBy(subject string) (node string, kind Kind, by string, err error) {
	// Tokens by hand, not strings.Split: the fold parses every message's
	// subject, and the slice Split allocates was a tenth of a catch-up's
	// allocations (issue 17).
	var toks [5]string
	n, rest := 0, subject
	for n < len(toks) {
		tok, more, found := strings.Cut(rest, ".")
		toks[n] = tok
		n++
		if !found {
			rest = ""
			break
		}
		rest = more
		if n == len(toks) {
			n++ // a sixth token: too many
		}
	}
	t := toks[:min(n, len(toks))]
	partition := -1
	if n == 4 || n == 5 {
		p, err := strconv.Atoi(t[0])
		if err != nil {
			return "", "", "", fmt.Errorf("%w: %s", ErrBadSubject, Short(subject))
		}
		partition, t = p, t[1:]
	}
	if n == 5 {
		by, t = t[3], t[:3]
	}
	if len(t) != 3 || n > 5 || t[0] != s.prefix() {
		return "", "", "", fmt.Errorf("%w: %s", ErrBadSubject, Short(subject))
	}
	if t[1] == FleetNode && t[2] == string(KindJournal) && by == "" {
		return FleetNode, KindJournal, "", nil
	}
	if !ValidName(t[1]) {
		return "", "", "", fmt.Errorf("%w: %s: node %v", ErrBadSubject, Short(subject), ErrBadName)
	}
	kind = Kind(t[2])
	if !kind.Known() {
		return t[1], "", "", fmt.Errorf("%w %s in %s", ErrUnknownKind, Short(t[2]), Short(subject))
	}
	if by != "" {
		switch {
		case !kind.Operator():
			return "", "", "", fmt.Errorf("%w: %s: %s is no operator kind", ErrBadSubject, Short(subject), kind)
		case !ValidName(by):
			return "", "", "", fmt.Errorf("%w: %s: operator %v", ErrBadSubject, Short(subject), ErrBadName)
		case partition != s.Partition(t[1]):
			return "", "", "", fmt.Errorf("%w: %s: not node %s's partition %d", ErrBadSubject, Short(subject), t[1], s.Partition(t[1]))
		}
	}
	return t[1], kind, by, nil
}

// RolloutToken is the second token of a fleet's rollout subjects,
// <prefix>.rollout.<fleet>.<kind> (DESIGN.md §11). They have four
// tokens, so the partition transform (<prefix>.*.*) leaves them as they
// are: they are stored in the nodes' stream, in its one order, outside
// every partition, and no node's subject can be one.
const RolloutToken = "rollout"

// Rollout returns the subject of fleet's rollout events of kind k
// (a rollout kind, see package rollout): <prefix>.rollout.<fleet>.<k>.
// It is the plain and the stored form at once. k "*" makes a filter.
func (s Subjects) Rollout(fleet, k string) string {
	return s.prefix() + "." + RolloutToken + "." + fleet + "." + k
}

// RolloutInput returns the pattern of every fleet's rollout subjects the
// stream captures: <prefix>.rollout.*.*.
func (s Subjects) RolloutInput() string { return s.Rollout("*", "*") }

// NamedRollout returns the subject on which the operator named by
// publishes fleet's rollout verb k (promote, pause, resume, abort,
// revert): <prefix>.rollout.<fleet>.<k>.<by>, the rollout subject with
// the operator's name as a fifth token. As for [Subjects.Named], the
// server lets a named operator's credentials publish a verb only on the
// subjects that end in its own name, and readers take the name from the
// subject ([Subjects.ParseRolloutBy]). A stream stores them once an
// operator asked ([Subjects.NamedRolloutInput]).
func (s Subjects) NamedRollout(fleet, k, by string) string {
	return s.Rollout(fleet, k) + "." + by
}

// NamedRolloutInput returns the pattern of every fleet's named rollout
// verbs: <prefix>.rollout.*.*.*. Five tokens: the partition transform
// (<prefix>.*.*) leaves them as they are, outside every partition, as
// the plain rollout subjects. Not in [Subjects.Captured]: a build before
// them refuses a stream that captures it (store.CaptureNamed adds it).
func (s Subjects) NamedRolloutInput() string { return s.RolloutInput() + ".*" }

// ParseRollout splits a rollout subject, plain or named
// ([Subjects.NamedRollout]), into fleet and kind; ok is false for any
// other subject (the kind is not checked: package rollout does).
func (s Subjects) ParseRollout(subject string) (fleet, kind string, ok bool) {
	fleet, kind, _, ok = s.ParseRolloutBy(subject)
	return fleet, kind, ok
}

// ParseRolloutBy is [Subjects.ParseRollout] that also returns the
// operator a named rollout subject names: the name the server checked
// against the publisher's credentials; empty for a plain rollout
// subject, whose payload's `by` is self-declared. A fifth token that is
// no valid name is no rollout subject (ok false).
func (s Subjects) ParseRolloutBy(subject string) (fleet, kind, by string, ok bool) {
	rest, found := strings.CutPrefix(subject, s.prefix()+"."+RolloutToken+".")
	if !found {
		return "", "", "", false
	}
	fleet, kind, found = strings.Cut(rest, ".")
	if !found || !ValidName(fleet) || kind == "" {
		return "", "", "", false
	}
	if k, name, named := strings.Cut(kind, "."); named {
		if k == "" || !ValidName(name) {
			return "", "", "", false
		}
		kind, by = k, name
	}
	return fleet, kind, by, true
}

// Captured returns the subject patterns every stream of this build
// captures: the node events' ([Subjects.Input]) and the fleets' rollout
// events'. The named operator events' ([Subjects.NamedInput]) are not
// among them: a stream gains those only when an operator asks
// (store.CaptureNamed, `meshfold auth add-operator`), since a build
// before them refuses a stream that has them (docs/architecture.md,
// "Named operators are an operator's step").
func (s Subjects) Captured() []string { return append(s.Input(), s.RolloutInput()) }
