package rollout_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
)

// TestFromNodeEvent: the fold reads a have's health and restarts, a
// plan's rows, a settle; an event that did not decode, or that the
// rollout does not read, is no input.
func TestFromNodeEvent(t *testing.T) {
	hv := &events.Have{Modules: []events.HaveModule{{Name: "web", Build: "b2", State: events.Running, Health: events.Unhealthy, Restarts: 2}}}
	in, ok := rollout.FromNodeEvent(events.Event{Seq: 7, Node: "ace", Kind: events.KindHave, Payload: hv})
	if !ok || in.Kind != rollout.KindHave || in.Seq != 7 || in.Node != "ace" {
		t.Fatalf("have: %+v %v", in, ok)
	}
	if m := in.Payload.(*rollout.Have).Modules[0]; m.Health != rollout.Unhealthy || m.Restarts != 2 {
		t.Fatalf("have module read as %+v", m)
	}
	if in, ok := rollout.FromNodeEvent(events.Event{Seq: 8, Node: "ace", Kind: events.KindWant, Payload: &events.Want{}}); !ok || in.Kind != rollout.KindWant {
		t.Fatalf("want: %+v %v", in, ok)
	}
	for _, ev := range []events.Event{
		{Seq: 9, Node: "ace", Kind: events.KindKnock, Payload: &events.Knock{}},
		{Seq: 10, Node: "ace", Kind: events.KindHave, Err: events.ErrMalformed},
		{Seq: 11, Node: "ace", Kind: events.KindPlan, Payload: &events.Plan{}, Foreign: true},
	} {
		if _, ok := rollout.FromNodeEvent(ev); ok {
			t.Errorf("#%d %s read as an input", ev.Seq, ev.Kind)
		}
	}
}

// A verb on a named operator's rollout subject is taken only as the
// operator the subject names: alice's subject with a payload naming bob
// is rejected (events.ErrNotPublisher), and so is any other kind there;
// a plain subject's (by "") is the payload's, self-declared.
func TestFromNamedRolloutEvent(t *testing.T) {
	data := func(by string) []byte {
		b, err := json.Marshal(rollout.Stamp(rollout.NewOperator(rollout.KindPause, 3, by, "migrating"), time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	now := time.Unix(1_700_000_000, 0)
	if in := rollout.FromNamedRolloutEvent(rollout.KindPause, data("alice"), 9, now, "alice"); in.Err != nil || in.Payload.(*rollout.Operator).By != "alice" {
		t.Errorf("alice's pause on alice's subject: %+v", in)
	}
	in := rollout.FromNamedRolloutEvent(rollout.KindPause, data("bob"), 10, now, "alice")
	if in.Payload != nil || !errors.Is(in.Err, events.ErrNotPublisher) {
		t.Errorf("a pause naming bob on alice's subject: payload %v, err %v; want ErrNotPublisher", in.Payload, in.Err)
	}
	tick, err := json.Marshal(rollout.Stamp(&rollout.Tick{Rollout: 3}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if in := rollout.FromNamedRolloutEvent(rollout.KindTick, tick, 11, now, "alice"); in.Payload != nil || !errors.Is(in.Err, events.ErrNotPublisher) {
		t.Errorf("a tick on alice's subject: payload %v, err %v; want ErrNotPublisher", in.Payload, in.Err)
	}
	if in := rollout.FromNamedRolloutEvent(rollout.KindPause, data("bob"), 12, now, ""); in.Err != nil || in.Payload.(*rollout.Operator).By != "bob" {
		t.Errorf("a plain pause naming bob: %+v", in)
	}
}
