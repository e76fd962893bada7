package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/meshfold/meshfold/events"
)

// A node that reboots loses what /run held; its module would crash-loop
// on the missing credential until the provisioner's resync (10 minutes)
// or an operator's poke (a fresh user's finding). The agent's new claim
// brings a knock with reason agent (or its have reporting the file gone
// at its start, reason missing, when the reconciler folds it first), and
// the running provisioner fills the file again: no poke, no resync.
func TestAgentBackRefillsWhatARebootTook(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ctx := m.ctx()
	n := m.newNode("ace")
	n.source(mbg, creds, secret)
	n.startAgent(nil)
	n.startProvisioner("prov")

	w := must(m.want(ctx, "ace", provisionerMod, mbgMod))(t)
	p, _ := must2(m.planOf(ctx, "ace", w))(t)
	must(m.settled(ctx, "ace", p))(t)
	must(m.filled(ctx, "ace", creds, p))(t)
	if content, _, err := n.file(creds); err != nil || content != secret {
		t.Fatalf("credential before the reboot: %v (content matches: %v)", err, content == secret)
	}
	up := must(m.waitEvent(ctx, "ace", events.KindAgent, func(ev events.Event) bool {
		return ev.Payload.(*events.Agent).State == events.AgentUp
	}))(t)

	// The machine goes down: the agent stops, /run is gone with it.
	n.agent.stop(t)
	if err := os.Remove(filepath.Join(n.root, creds)); err != nil {
		t.Fatal(err)
	}
	n.startAgent(nil)

	knock := must(m.waitEvent(ctx, "ace", events.KindKnock, func(ev events.Event) bool {
		r := ev.Payload.(*events.Knock).Reasons
		return slices.Contains(r, events.KnockAgent) || slices.Contains(r, events.KnockMissing)
	}))(t)
	// Its cause is the new agent's up, or its have reporting the file
	// gone at its start, whichever the reconciler folded first: the
	// agent's start knocks once.
	seq := knock.Payload.(*events.Knock).Cause
	var cause events.Event
	evs := append(must(m.events(ctx, "ace", events.KindAgent))(t), must(m.events(ctx, "ace", events.KindHave))(t)...)
	if i := slices.IndexFunc(evs, func(ev events.Event) bool { return ev.Seq == seq }); i >= 0 {
		cause = evs[i]
	}
	switch c := cause.Payload.(type) {
	case *events.Agent:
		if c.State != events.AgentUp || c.Claim == up.Payload.(*events.Agent).Claim || !slices.Equal(knock.Payload.(*events.Knock).Reasons, []events.KnockReason{events.KnockAgent}) {
			t.Fatalf("knock #%d's cause #%d is not the new agent's up", knock.Seq, seq)
		}
	case *events.Have:
		if c.Started == "" || c.Started == up.Payload.(*events.Agent).Claim ||
			!slices.Contains(c.Missing, events.MissingFile{Module: mbg, Path: creds, AtStart: true}) {
			t.Fatalf("knock #%d's cause, have #%d, is not the new agent's report of the file gone at its start: %+v", knock.Seq, seq, c)
		}
	default:
		t.Fatalf("knock #%d's cause #%d is neither the new agent's up nor its have", knock.Seq, seq)
	}
	must(m.waitEvent(ctx, "ace", events.KindFilled, func(ev events.Event) bool {
		return ev.Seq > knock.Seq && ev.Payload.(*events.Filled).Path == creds
	}))(t)
	if content, mode, err := n.file(creds); err != nil || content != secret || mode != 0o600 {
		t.Fatalf("credential after the reboot: mode %v, %v (content matches: %v)", mode, err, content == secret)
	}
	m.assertNoLeak()
}
