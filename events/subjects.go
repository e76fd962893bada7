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

// StoredNode returns the stored-subject filter of every event of node.
func (s Subjects) StoredNode(node string) string {
	return strconv.Itoa(s.Partition(node)) + "." + s.prefix() + "." + node + ".*"
}

// StoredPartition returns the stored-subject filters of partition p for the
// given kinds: <p>.<prefix>.*.<kind>.
func (s Subjects) StoredPartition(p int, kinds ...Kind) []string {
	out := make([]string, len(kinds))
	for i, k := range kinds {
		out[i] = strconv.Itoa(p) + "." + s.prefix() + ".*." + string(k)
	}
	return out
}

// StoredKind returns the stored-subject filter of every node's events of
// kind k, all partitions: *.<prefix>.*.<k>.
func (s Subjects) StoredKind(k Kind) string { return "*." + s.prefix() + ".*." + string(k) }

// StoredPartitionAll returns the stored-subject filter of every event of
// partition p: <p>.<prefix>.*.*.
func (s Subjects) StoredPartitionAll(p int) string {
	return strconv.Itoa(p) + "." + s.prefix() + ".*.*"
}

// FleetNode is the node token of the fleet-wide journal,
// <prefix>._fleet.journal: where the reconciler notes events whose subject
// names no valid node (so no node's journal can hold them). It is no
// valid node name, so no node can be called that; [Subjects.Parse]
// accepts it for the journal kind only.
const FleetNode = "_fleet"

// Parse splits a plain or stored subject into node and kind. The partition
// token, when there, is checked to be a number and dropped.
//
// Errors: ErrBadSubject when the subject has another shape or prefix or an
// invalid node name ([FleetNode] is taken for the journal kind only);
// ErrUnknownKind for an unknown last token. Errors quote the subject
// through [Short].
func (s Subjects) Parse(subject string) (node string, kind Kind, err error) {
	// Tokens by hand, not strings.Split: the fold parses every message's
	// subject, and the slice Split allocates was a tenth of a catch-up's
	// allocations (issue 17).
	var toks [4]string
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
			n++ // a fifth token: too many
		}
	}
	t := toks[:min(n, len(toks))]
	if n == 4 {
		if _, err := strconv.Atoi(t[0]); err != nil {
			return "", "", fmt.Errorf("%w: %q", ErrBadSubject, subject)
		}
		t = t[1:]
	}
	if len(t) != 3 || n > 4 || t[0] != s.prefix() {
		return "", "", fmt.Errorf("%w: %s", ErrBadSubject, Short(subject))
	}
	if t[1] == FleetNode && t[2] == string(KindJournal) {
		return FleetNode, KindJournal, nil
	}
	if !ValidName(t[1]) {
		return "", "", fmt.Errorf("%w: %s: node %v", ErrBadSubject, Short(subject), ErrBadName)
	}
	kind = Kind(t[2])
	if !kind.Known() {
		return t[1], "", fmt.Errorf("%w %s in %s", ErrUnknownKind, Short(t[2]), Short(subject))
	}
	return t[1], kind, nil
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

// ParseRollout splits a rollout subject into fleet and kind; ok is false
// for any other subject (the kind is not checked: package rollout does).
func (s Subjects) ParseRollout(subject string) (fleet, kind string, ok bool) {
	rest, found := strings.CutPrefix(subject, s.prefix()+"."+RolloutToken+".")
	if !found {
		return "", "", false
	}
	fleet, kind, found = strings.Cut(rest, ".")
	if !found || !ValidName(fleet) || kind == "" || strings.Contains(kind, ".") {
		return "", "", false
	}
	return fleet, kind, true
}

// Captured returns every subject pattern the stream captures: the node
// events' ([Subjects.Input]) and the fleets' rollout events'.
func (s Subjects) Captured() []string { return append(s.Input(), s.RolloutInput()) }
