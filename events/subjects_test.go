package events_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/events"
)

// splitParse is Subjects.Parse as it was written with strings.Split: the
// reference the hand tokenizer must agree with.
func splitParse(s events.Subjects, subject string) (string, events.Kind, bool) {
	toks := strings.Split(subject, ".")
	if len(toks) == 4 {
		if _, err := strconv.Atoi(toks[0]); err != nil {
			return "", "", false
		}
		toks = toks[1:]
	}
	prefix := s.Prefix
	if prefix == "" {
		prefix = "mesh"
	}
	if len(toks) != 3 || toks[0] != prefix {
		return "", "", false
	}
	if toks[1] == events.FleetNode && toks[2] == string(events.KindJournal) {
		return events.FleetNode, events.KindJournal, true
	}
	if !events.ValidName(toks[1]) || !events.Kind(toks[2]).Known() {
		return "", "", false
	}
	return toks[1], events.Kind(toks[2]), true
}

// FuzzParseSubject: the tokenizer of Subjects.Parse accepts exactly the
// subjects the Split-based one did, with the same node and kind, and
// errors match ErrBadSubject or ErrUnknownKind.
func FuzzParseSubject(f *testing.F) {
	for _, s := range []string{"mesh.ace.want", "3.mesh.ace.plan", "mesh._fleet.journal", "3.mesh.ace.plan.x",
		"x.mesh.ace.plan", "mesh.ace", "mesh.ace.nope", "mesh.Ace.want", "", ".", "mesh..want", "mesh.ace.want.",
		"12.mesh.node-01.have", "other.ace.want", "1.2.3.4.5"} {
		f.Add(s)
	}
	subj := events.Subjects{}
	f.Fuzz(func(t *testing.T, subject string) {
		node, kind, err := subj.Parse(subject)
		wantNode, wantKind, ok := splitParse(subj, subject)
		if ok != (err == nil) {
			t.Fatalf("Parse(%q) = %q %q %v; the Split parse says ok=%v", subject, node, kind, err, ok)
		}
		if ok && (node != wantNode || kind != wantKind) {
			t.Fatalf("Parse(%q) = %q %q, want %q %q", subject, node, kind, wantNode, wantKind)
		}
		if err != nil && !errors.Is(err, events.ErrBadSubject) && !errors.Is(err, events.ErrUnknownKind) {
			t.Fatalf("Parse(%q): %v matches neither sentinel", subject, err)
		}
	})
}
