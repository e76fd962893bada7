package rollout_test

import (
	"testing"

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
