package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
)

// With serve --max-age a quiet node's plan ages out of the stream; at its
// next reboot (/run is tmpfs: the filled file is gone) its agent and
// provisioner read no plan. Nothing refilled the credential and every
// view stayed green (a fresh user's finding U28). The agent's have says
// it holds no plan, the reconciler publishes the node's plan again, and
// the file is filled again within the deadline, with no want or poke.
// The age-out is the stream's purge of every event before a later one:
// what max-age does, without waiting for it.
func TestRebootAfterThePlanAgedOutRefills(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ctx := m.ctx()
	n := m.newNode("kit")
	n.source(mbg, creds, secret)
	n.startAgent(nil)
	n.startProvisioner("prov")

	w := must(m.want(ctx, "kit", provisionerMod, mbgMod))(t)
	p, _ := must2(m.planOf(ctx, "kit", w))(t)
	must(m.settled(ctx, "kit", p))(t)
	must(m.filled(ctx, "kit", creds, p))(t)

	// The machine goes down: agent and provisioner stop, /run is gone.
	n.agent.stop(t)
	n.provisioner.stop(t)
	if err := os.Remove(filepath.Join(n.root, creds)); err != nil {
		t.Fatal(err)
	}
	// Every event of the node ages out: only a later one of another
	// node is left.
	ack := must(m.pub.Append(ctx, "other", events.Stamp(&events.Have{Modules: []events.HaveModule{}}, time.Now())))(t)
	stream := must(m.js.Stream(ctx, m.cfg.Name))(t)
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(ack.Seq)); err != nil {
		t.Fatal(err)
	}
	if plans := must(m.events(ctx, "kit", events.KindPlan))(t); len(plans) != 0 {
		t.Fatalf("%d plans of kit left in the stream after the age-out", len(plans))
	}

	rebooted := time.Now()
	n.startAgent(nil)
	n.startProvisioner("prov")
	again := must(m.waitEvent(ctx, "kit", events.KindPlan, func(ev events.Event) bool { return ev.Seq > ack.Seq }))(t)
	must(m.filled(ctx, "kit", creds, again.Seq))(t)
	if content, mode, err := n.file(creds); err != nil || content != secret || mode != 0o600 {
		t.Fatalf("credential after the reboot: mode %v, %v (content matches: %v)", mode, err, content == secret)
	}
	t.Logf("filled again %s after the reboot (plan #%d published again)", time.Since(rebooted).Round(time.Millisecond), again.Seq)
	m.assertNoLeak()
}

// A provisioner restarted alone after every event of its node aged out
// (the node's agent runs on with its plan and publishes no have saying
// otherwise) found no plan and filled nothing: a file deleted on the node
// then was reported missing and knocked for, and never filled (noticed by
// a fresh user, reproduced with real processes: provfix). The reconciler,
// recording the provisioner's up, finds no plan of the node in the stream
// and says so (events.Prov.NoPlan); the fold publishes the plan again,
// the agent settles it, and the provisioner fills by it.
func TestProvisionerRestartedAfterThePlanAgedOutFills(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ctx := m.ctx()
	n := m.newNode("kit")
	n.leased = true // its lease's up and down: prov events
	n.source(mbg, creds, secret)
	n.startAgent(nil)
	n.startProvisioner("prov")

	w := must(m.want(ctx, "kit", provisionerMod, mbgMod))(t)
	p, _ := must2(m.planOf(ctx, "kit", w))(t)
	must(m.settled(ctx, "kit", p))(t)
	must(m.filled(ctx, "kit", creds, p))(t)

	// The provisioner stops; the node's plan ages out (a quiet node's
	// oldest event; the purge of its subject is what max-age does to it,
	// without waiting. Not every event: the reconciler's exactly-once
	// ids of the provisioner's liveness count from the previous one,
	// which a real age-out removes only past the dedup window).
	n.provisioner.stop(t)
	ack := must(m.pub.Append(ctx, "other", events.Stamp(&events.Have{Modules: []events.HaveModule{}}, time.Now())))(t)
	stream := must(m.js.Stream(ctx, m.cfg.Name))(t)
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject(m.cfg.Subjects().Stored("kit", events.KindPlan))); err != nil {
		t.Fatal(err)
	}
	if plans := must(m.events(ctx, "kit", events.KindPlan))(t); len(plans) != 0 {
		t.Fatalf("%d plans of kit left in the stream after the age-out", len(plans))
	}
	restarted := time.Now()
	n.startProvisioner("prov")
	up := must(m.waitEvent(ctx, "kit", events.KindProv, func(ev events.Event) bool {
		return ev.Seq > ack.Seq && ev.Payload.(*events.Prov).State == events.AgentUp
	}))(t)
	if !up.Payload.(*events.Prov).NoPlan {
		t.Fatalf("the provisioner's up #%d does not say the stream holds no plan of kit", up.Seq)
	}
	again := must(m.waitEvent(ctx, "kit", events.KindPlan, func(ev events.Event) bool { return ev.Seq > up.Seq }))(t)
	must(m.settled(ctx, "kit", again.Seq))(t)

	// The file deleted on the node is filled again by the plan published
	// again (here by a poke's knock: the look at files is the agent's).
	if err := os.Remove(filepath.Join(n.root, creds)); err != nil {
		t.Fatal(err)
	}
	m.operator(ctx, "kit", &events.Poke{By: "ops"})
	must(m.filled(ctx, "kit", creds, again.Seq))(t)
	if content, mode, err := n.file(creds); err != nil || content != secret || mode != 0o600 {
		t.Fatalf("credential after the restart: mode %v, %v (content matches: %v)", mode, err, content == secret)
	}
	t.Logf("filled again %s after the provisioner's restart (plan #%d published again on its up #%d)", time.Since(restarted).Round(time.Millisecond), again.Seq, up.Seq)
	m.assertNoLeak()
}
