package events_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
)

// splitParse is Subjects.Parse as it was written with strings.Split: the
// reference the hand tokenizer must agree with.
func splitParse(s events.Subjects, subject string) (string, events.Kind, bool) {
	toks := strings.Split(subject, ".")
	partition, by := -1, ""
	if len(toks) == 4 || len(toks) == 5 {
		p, err := strconv.Atoi(toks[0])
		if err != nil {
			return "", "", false
		}
		partition, toks = p, toks[1:]
	}
	if len(toks) == 4 {
		by, toks = toks[3], toks[:3]
	}
	prefix := s.Prefix
	if prefix == "" {
		prefix = "mesh"
	}
	if len(toks) != 3 || toks[0] != prefix {
		return "", "", false
	}
	if toks[1] == events.FleetNode && toks[2] == string(events.KindJournal) && by == "" {
		return events.FleetNode, events.KindJournal, true
	}
	if !events.ValidName(toks[1]) || !events.Kind(toks[2]).Known() {
		return "", "", false
	}
	if by != "" && (!events.Kind(toks[2]).Operator() || !events.ValidName(by) || partition != s.Partition(toks[1])) {
		return "", "", false
	}
	return toks[1], events.Kind(toks[2]), true
}

// A named operator's subject: built by Named, parsed back with its
// operator, refused outside its node's partition, for a kind no operator
// publishes, or with a bad name; a payload whose by is not the subject's
// operator is decoded as an invalid event.
func TestNamedSubjects(t *testing.T) {
	subj := events.Subjects{Partitions: 7}
	named := subj.Named("ace", events.KindApprove, "alice")
	if want := strconv.Itoa(subj.Partition("ace")) + ".mesh.ace.approve.alice"; named != want {
		t.Fatalf("Named = %q, want %q", named, want)
	}
	node, kind, by, err := subj.ParseBy(named)
	if err != nil || node != "ace" || kind != events.KindApprove || by != "alice" {
		t.Fatalf("ParseBy(%q) = %q %q %q %v", named, node, kind, by, err)
	}
	if _, _, by, err := subj.ParseBy(subj.Stored("ace", events.KindApprove)); err != nil || by != "" {
		t.Errorf("a stored subject: by %q, %v; want none", by, err)
	}
	other := strconv.Itoa((subj.Partition("ace")+1)%7) + ".mesh.ace.approve.alice"
	for _, bad := range []string{other, subj.Stored("ace", events.KindHave) + ".alice",
		subj.Stored("ace", events.KindApprove) + ".Alice", "mesh.ace.approve.alice", subj.Stored(events.FleetNode, events.KindJournal) + ".alice"} {
		if _, _, _, err := subj.ParseBy(bad); !errors.Is(err, events.ErrBadSubject) {
			t.Errorf("ParseBy(%q): %v, want ErrBadSubject", bad, err)
		}
	}
	if got := subj.StoredNode("ace"); !strings.HasSuffix(got, ".mesh.ace.>") {
		t.Errorf("StoredNode = %q: misses the named events", got)
	}
	for p := range 7 {
		if !slicesContains(subj.NamedInput(), strconv.Itoa(p)+".mesh.*.*.*") {
			t.Errorf("NamedInput() %v: no named events of partition %d", subj.NamedInput(), p)
		}
	}
	// Not among what every stream captures: a stream gains them when an
	// operator asks (an older build refuses a stream that has them).
	for _, c := range subj.Captured() {
		if slicesContains(subj.NamedInput(), c) {
			t.Errorf("Captured() %v holds the named pattern %s", subj.Captured(), c)
		}
	}

	data := func(by string) []byte {
		b, err := events.Encode(events.Stamp(&events.Approve{Module: "nats", Build: "img:1", By: by}, time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ev, err := subj.DecodeEvent(named, data("alice"), 9, time.Time{})
	if err != nil || ev.Err != nil || ev.Payload.(*events.Approve).By != "alice" {
		t.Fatalf("alice's approval by alice: %+v %v", ev, err)
	}
	ev, err = subj.DecodeEvent(named, data("bob"), 10, time.Time{})
	if err != nil || ev.Payload != nil || !errors.Is(ev.Err, events.ErrNotPublisher) || !errors.Is(ev.Err, events.ErrInvalid) {
		t.Fatalf("alice's approval claiming bob: payload %v, err %v (%v); want ErrNotPublisher", ev.Payload, ev.Err, err)
	}
	t.Logf("alice's approval claiming bob: %v", ev.Err)
	// The shared operator's plain subject: by as given (self-declared).
	if ev, err := subj.DecodeEvent(subj.Stored("ace", events.KindApprove), data("bob"), 11, time.Time{}); err != nil || ev.Err != nil {
		t.Errorf("a plain approval: %v %v", err, ev.Err)
	}
}

func slicesContains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// FuzzParseSubject: the tokenizer of Subjects.Parse accepts exactly the
// subjects the Split-based one did, with the same node and kind, and
// errors match ErrBadSubject or ErrUnknownKind.
func FuzzParseSubject(f *testing.F) {
	for _, s := range []string{"mesh.ace.want", "3.mesh.ace.plan", "mesh._fleet.journal", "3.mesh.ace.plan.x",
		"x.mesh.ace.plan", "mesh.ace", "mesh.ace.nope", "mesh.Ace.want", "", ".", "mesh..want", "mesh.ace.want.",
		"12.mesh.node-01.have", "other.ace.want", "1.2.3.4.5", "12.mesh.ace.approve.alice", "2.mesh.ace.approve.alice",
		"2.mesh.ace.have.alice", "1.2.3.4.5.6"} {
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

// Every operator kind names its operator (By), so a named operator's
// event of any kind is checked against its subject and folds: a gate by
// alice on alice's subject was decoded as "not the operator whose
// credentials published the event" (fresh13 G1), since By did not know
// the gate, a kind added beside the named subjects.
func TestEveryOperatorKindHasItsBy(t *testing.T) {
	for _, k := range events.OperatorKinds {
		if _, ok := events.By(events.New(k)); !ok {
			t.Errorf("By(%s): not an operator event", k)
		}
	}
	subj := events.Subjects{Partitions: 7}
	for _, lift := range []bool{false, true} {
		b, err := events.Encode(events.Stamp(&events.Gate{Module: "db", Lift: lift, By: "alice"}, time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		ev, err := subj.DecodeEvent(subj.Named("ace", events.KindGate, "alice"), b, 3, time.Time{})
		if err != nil || ev.Err != nil || ev.Payload.(*events.Gate).By != "alice" {
			t.Errorf("alice's gate (lift %v) on her subject: %+v %v", lift, ev, err)
		}
		ev, err = subj.DecodeEvent(subj.Named("ace", events.KindGate, "bob"), b, 4, time.Time{})
		if err != nil || ev.Payload != nil || !errors.Is(ev.Err, events.ErrNotPublisher) {
			t.Errorf("alice's gate (lift %v) on bob's subject: payload %v, err %v (%v); want ErrNotPublisher", lift, ev.Payload, ev.Err, err)
		}
	}
}

// A named operator's rollout verb, <prefix>.rollout.<fleet>.<verb>.<name>:
// parsed with the name; a plain rollout subject has none; a fifth token
// that is no name, or a sixth, is no rollout subject. The pattern is not
// among what every stream captures.
func TestNamedRolloutSubjects(t *testing.T) {
	subj := events.Subjects{Prefix: "mesh", Partitions: 7}
	named := subj.NamedRollout("web", "pause", "alice")
	if named != "mesh.rollout.web.pause.alice" {
		t.Fatalf("NamedRollout = %q", named)
	}
	if fleet, kind, by, ok := subj.ParseRolloutBy(named); !ok || fleet != "web" || kind != "pause" || by != "alice" {
		t.Errorf("ParseRolloutBy(%q) = %q %q %q %v", named, fleet, kind, by, ok)
	}
	if fleet, kind, ok := subj.ParseRollout(named); !ok || fleet != "web" || kind != "pause" {
		t.Errorf("ParseRollout(%q) = %q %q %v", named, fleet, kind, ok)
	}
	if _, kind, by, ok := subj.ParseRolloutBy(subj.Rollout("web", "pause")); !ok || kind != "pause" || by != "" {
		t.Errorf("a plain rollout subject: kind %q by %q %v", kind, by, ok)
	}
	for _, bad := range []string{"mesh.rollout.web.pause.Alice", "mesh.rollout.web.pause.alice.x", "mesh.rollout.web..alice", "mesh.rollout.web.pause."} {
		if _, _, _, ok := subj.ParseRolloutBy(bad); ok {
			t.Errorf("ParseRolloutBy(%q): ok, want not a rollout subject", bad)
		}
	}
	if got := subj.NamedRolloutInput(); got != "mesh.rollout.*.*.*" {
		t.Errorf("NamedRolloutInput = %q", got)
	}
	if slicesContains(subj.Captured(), subj.NamedRolloutInput()) {
		t.Errorf("Captured() %v holds the named rollouts' pattern", subj.Captured())
	}
}
