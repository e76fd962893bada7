package reconcile

import (
	"strconv"
	"strings"

	"github.com/meshfold/meshfold/events"
)

// Effect is one event the shell must publish on the node's subject of Kind:
// a plan, a knock or a journal entry.
type Effect struct {
	Node string
	// Kind is events.KindPlan, events.KindKnock or events.KindJournal.
	Kind events.Kind
	// Cause is the stream sequence of the event whose folding produced it.
	Cause uint64
	// N counts the effects of this Kind produced by the same cause: 0, 1, …
	N int
	// Payload is *events.Plan, *events.Knock or *events.Journal, stamped
	// with v and the cause's at.
	Payload events.Payload
}

// ID is the effect's message id, `<node>.<kind>.<cause>.<n>` (DESIGN.md
// §3). A replay or restart makes the same ids.
func (e Effect) ID() string {
	return EffectID(e.Node, e.Kind, e.Cause, e.N)
}

// EffectID formats an effect message id.
func EffectID(node string, kind events.Kind, cause uint64, n int) string {
	b := make([]byte, 0, len(node)+len(kind)+24)
	b = append(b, node...)
	b = append(b, '.')
	b = append(b, kind...)
	b = append(b, '.')
	b = strconv.AppendUint(b, cause, 10)
	b = append(b, '.')
	b = strconv.AppendInt(b, int64(n), 10)
	return string(b)
}

// ParseEffectID splits an effect id into node, kind, cause and n. ok is
// false when id is not of that form or names no effect kind (plan, knock,
// journal).
func ParseEffectID(id string) (node string, kind events.Kind, cause uint64, n int, ok bool) {
	// node.kind.cause.n: node has no dots.
	var parts [4]string
	rest := id
	for i := 0; i < 3; i++ {
		j := strings.IndexByte(rest, '.')
		if j < 0 {
			return "", "", 0, 0, false
		}
		parts[i], rest = rest[:j], rest[j+1:]
	}
	parts[3] = rest
	if !events.Kind(parts[1]).Effect() {
		return "", "", 0, 0, false // not an effect: a node's refusal id, say
	}
	c, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil {
		return "", "", 0, 0, false
	}
	nn, err := strconv.Atoi(parts[3])
	if err != nil || nn < 0 {
		return "", "", 0, 0, false
	}
	return parts[0], events.Kind(parts[1]), c, nn, true
}
