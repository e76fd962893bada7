package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// A forged plan is never applied, and the reconciler restores the right
// one: issue 14's attack (a plan on mesh.ace.plan that runs "evil" as root
// and drops every other module) three ways: unsigned, signed with a key
// nobody trusts, and carrying the signature of another node's real plan.
// For each, the agent refuses it (with a failed settle), the reconciler,
// started after it, journals it at error and publishes its own last plan
// again under the forgery's cause, and the node settles that plan.
func TestForgedPlanNeverApplied(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ctx := m.ctx()
	n := m.newNode("ace")
	n.startAgent(nil)
	w := must(m.want(ctx, "ace", provisionerMod, mbgMod))(t)
	p1, real := must2(m.planOf(ctx, "ace", w))(t)
	must(m.settled(ctx, "ace", p1))(t)

	// Node shanks' real plan, whose signature the third forgery copies.
	shanks := m.newNode("shanks")
	shanks.startAgent(nil)
	ws := must(m.want(ctx, "shanks", provisionerMod))(t)
	ps, _ := must2(m.planOf(ctx, "shanks", ws))(t)
	stream := must(m.js.Stream(ctx, m.cfg.Name))(t)
	shanksPlan := must(store.LastMsg(ctx, stream, m.cfg.Subjects(), "shanks", events.KindPlan))(t)
	if shanksPlan.Event.Seq != ps {
		t.Fatalf("shanks' newest plan is %d, want %d", shanksPlan.Event.Seq, ps)
	}

	evil := events.Stamp(&events.Plan{Cause: real.Cause, Want: real.Want, Modules: []events.PlanModule{
		{Name: "evil", Build: "x:1", RunsAs: "root", Files: []events.File{}}}}, time.Now())
	otherKey := must(store.NewSigningKey())(t)
	other := must(store.NewSigner(otherKey))(t)
	forgeries := []struct {
		name    string
		publish func() uint64
	}{
		{"unsigned", func() uint64 {
			return must(m.pub.Append(ctx, "ace", evil, store.WithMsgID(nuid.Next())))(t).Seq
		}},
		{"signed with an untrusted key", func() uint64 {
			return must(m.pub.Append(ctx, "ace", evil, store.WithMsgID(nuid.Next()), store.WithSigner(other)))(t).Seq
		}},
		{"another node's signature", func() uint64 {
			msg := nats.NewMsg(m.cfg.Subjects().Event("ace", events.KindPlan))
			msg.Data = shanksPlan.Data
			msg.Header.Set(store.HeaderSigner, shanksPlan.Header.Get(store.HeaderSigner))
			msg.Header.Set(store.HeaderSignature, shanksPlan.Header.Get(store.HeaderSignature))
			ack := must(m.js.PublishMsg(ctx, msg, jetstream.WithMsgID(nuid.Next())))(t)
			return ack.Sequence
		}},
	}
	for _, f := range forgeries {
		// With the reconciler stopped, the forgery is the newest plan the
		// agent sees: it must refuse it (a failed settle naming it), not
		// skip it as superseded by the plan published again.
		m.reconciler.stop(t)
		m.rc.Store(nil)
		seq := f.publish()
		refused := must(m.waitEvent(ctx, "ace", events.KindSettle, func(ev events.Event) bool {
			s := ev.Payload.(*events.Settle)
			return s.Plan == seq && s.Op == events.OpFailed
		}))(t).Payload.(*events.Settle)
		if !strings.Contains(refused.Error, "not from a trusted reconciler") {
			t.Errorf("%s: the agent's failed settle says %q", f.name, refused.Error)
		}
		if runs := must(n.runs(ctx))(t); len(runs) != 2 {
			t.Fatalf("%s: the node runs %v after the forgery", f.name, runs)
		}
		m.startReconciler()
		journal := must(m.waitEvent(ctx, "ace", events.KindJournal, func(ev events.Event) bool {
			return ev.Payload.(*events.Journal).Cause == seq
		}))(t).Payload.(*events.Journal)
		if journal.Level != events.LevelError || !strings.Contains(journal.Msg, "not emitted by this reconciler") {
			t.Errorf("%s: journal %+v, want an error saying the plan is not the reconciler's", f.name, journal)
		}
		restored, plan := must2(m.planOf(ctx, "ace", seq))(t)
		if !equalModules(plan.Modules, real.Modules) || plan.ProvisionerAccount != real.ProvisionerAccount {
			t.Errorf("%s: plan published again = %+v, want the real plan's rows %+v", f.name, plan, real)
		}
		must(m.settled(ctx, "ace", restored))(t)
		runs := must(n.runs(ctx))(t)
		if _, ok := runs["evil"]; ok || len(runs) != 2 {
			t.Fatalf("%s: the node runs %v, want the provisioner and %s only", f.name, runs, mbg)
		}
	}
	if strings.Contains(m.logs.String(), `module applied module=evil`) {
		t.Error("a forged plan was applied")
	}
}

func equalModules(a, b []events.PlanModule) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].Build != b[i].Build || a[i].RunsAs != b[i].RunsAs || len(a[i].Files) != len(b[i].Files) {
			return false
		}
	}
	return true
}

// After a key rotation the reconciler still takes the plans it signed
// with its retired key for its own: refolded from the start of the stream
// (its snapshot gone), it journals no forgery and publishes no plan again.
// Without the retired key among its own, the same refold would.
func TestRotatedKeyRefoldsOwnPlans(t *testing.T) {
	t.Parallel()
	for _, keepRetired := range []bool{true, false} {
		t.Run(fmt.Sprintf("retired key kept %v", keepRetired), func(t *testing.T) {
			m := newMesh(t)
			ctx := m.ctx()
			n := m.newNode("ace")
			n.startAgent(nil)
			w := must(m.want(ctx, "ace", provisionerMod, mbgMod))(t)
			p1, _ := must2(m.planOf(ctx, "ace", w))(t)
			must(m.settled(ctx, "ace", p1))(t)
			m.reconciler.stop(t)
			m.rc.Store(nil)

			// Rotate, and forget every snapshot of the node's partition.
			old := m.signer.PublicKey()
			m.signer = must(store.NewSigner(must(store.NewSigningKey())(t)))(t)
			if keepRetired {
				m.own = must(store.NewTrust(m.signer.PublicKey(), old))(t)
			}
			kv := must(m.js.KeyValue(ctx, m.cfg.Name+store.SnapshotBucketSuffix))(t)
			keys := must(kv.ListKeys(ctx))(t)
			for k := range keys.Keys() {
				if strings.HasPrefix(k, "node.") || strings.HasPrefix(k, "checkpoint.") {
					if err := kv.Purge(ctx, k); err != nil {
						t.Fatal(err)
					}
				}
			}
			m.startReconciler()
			// A new want: once its plan is out, the refold of the old
			// ones is done.
			w2 := must(m.want(ctx, "ace", provisionerMod))(t)
			must2(m.planOf(ctx, "ace", w2))(t)
			var forged int
			for _, ev := range must(m.events(ctx, "ace", events.KindJournal))(t) {
				if strings.Contains(ev.Payload.(*events.Journal).Msg, "not emitted by this reconciler") {
					forged++
				}
			}
			switch {
			case keepRetired && forged != 0:
				t.Errorf("%d plans of the retired key journaled as forged", forged)
			case !keepRetired && forged == 0:
				t.Error("without the retired key the refold found no forged plan: the test shows nothing")
			}
		})
	}
}

// Issue 24's wedge: a plan for ace signed by a key the agent trusts but
// the reconciler does not sign with (another deployment's, once in a
// shared trust file; or the reconciler's retired key during a rotation's
// overlap), published while the reconciler is away, with an inflated
// cause. It used to be applied, and its cause made the agent refuse the
// reconciler's correction and every later plan as replayed. Now the agent
// refuses a cause that is not below the plan's own sequence, and a
// retired key's plan after a current one; a foreign plan it may apply
// (the highest cause the rule lets a signer claim) is corrected by the
// reconciler, which journals it and publishes its own plan again; and in
// every case the node converges to the genuine plan and applies the next
// want's.
func TestInflatedCauseWedge(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		retired bool // signed by the reconciler's retired key, else another deployment's
		ahead   bool // cause above the plan's own sequence, else just below it
		refused string
	}{
		{"foreign key, cause ahead", false, true, "cause ahead"},
		{"foreign key, highest cause allowed", false, false, ""},
		{"retired key, cause ahead", true, true, "cause ahead"},
		{"retired key, highest cause allowed", true, false, "a retired key's plan is never newer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMesh(t)
			ctx := m.ctx()
			other := must(store.NewSigner(must(store.NewSigningKey())(t)))(t)
			old := must(store.NewSigner(must(store.NewSigningKey())(t)))(t)
			m.trust = must(store.NewTrust(m.signer.PublicKey(), other.PublicKey()))(t)
			must(m.trust.Retire(old.PublicKey(), time.Now().Add(time.Hour)))(t)
			m.own = must(store.NewTrust(m.signer.PublicKey(), old.PublicKey()))(t)
			n := m.newNode("vic")
			n.startAgent(nil)
			w := must(m.want(ctx, "vic", provisionerMod, mbgMod))(t)
			p1, real := must2(m.planOf(ctx, "vic", w))(t)
			must(m.settled(ctx, "vic", p1))(t)

			// The reconciler waits (out of its lease, or stopped): the
			// forgery is the newest plan the agent sees.
			m.reconciler.stop(t)
			m.rc.Store(nil)
			signer := other
			if c.retired {
				signer = old
			}
			stream := must(m.js.Stream(ctx, m.cfg.Name))(t)
			last := must(stream.Info(ctx))(t).State.LastSeq
			cause := last // below the forgery's own sequence
			if c.ahead {
				cause = last + 500
			}
			evil := events.Stamp(&events.Plan{Cause: cause, Want: real.Want, ProvisionerAccount: "mallory", Modules: []events.PlanModule{
				{Name: "evil", Build: "evil:1", RunsAs: "root", Files: []events.File{}}}}, time.Now())
			forged := must(m.pub.Append(ctx, "vic", evil, store.WithMsgID(fmt.Sprintf("vic.plan.%d.0", cause)), store.WithSigner(signer)))(t).Seq
			s := must(m.waitEvent(ctx, "vic", events.KindSettle, func(ev events.Event) bool {
				return ev.Payload.(*events.Settle).Plan == forged
			}))(t).Payload.(*events.Settle)
			switch {
			case c.refused != "" && (s.Op != events.OpFailed || !strings.Contains(s.Error, c.refused)):
				t.Fatalf("the forgery's settle %+v, want refused saying %q", s, c.refused)
			case c.refused == "" && s.Op == events.OpFailed:
				t.Fatalf("the forgery's settle %+v: the rule lets a trusted key's plan with this cause through", s)
			}

			// The reconciler comes back: it journals the plan it did not
			// emit and publishes its own again, which the node settles.
			m.startReconciler()
			journal := must(m.waitEvent(ctx, "vic", events.KindJournal, func(ev events.Event) bool {
				return ev.Payload.(*events.Journal).Cause == forged
			}))(t).Payload.(*events.Journal)
			if journal.Level != events.LevelError || !strings.Contains(journal.Msg, "not emitted by this reconciler") {
				t.Errorf("journal %+v, want an error saying the plan is not the reconciler's", journal)
			}
			restored, plan := must2(m.planOf(ctx, "vic", forged))(t)
			if !equalModules(plan.Modules, real.Modules) {
				t.Errorf("plan published again = %+v, want the genuine rows %+v", plan.Modules, real.Modules)
			}
			must(m.settled(ctx, "vic", restored))(t)

			// The next want's plan is applied: nothing is wedged.
			w2 := must(m.want(ctx, "vic", provisionerMod))(t)
			p2, _ := must2(m.planOf(ctx, "vic", w2))(t)
			must(m.settled(ctx, "vic", p2))(t)
			runs := must(n.runs(ctx))(t)
			if _, ok := runs["evil"]; ok || len(runs) != 1 {
				t.Fatalf("the node runs %v, want the provisioner alone", runs)
			}
		})
	}
}

// After a key rotation whose overlap has ended, a node agent that restarts
// (a reboot) re-verifies its newest plan, of the retired key, and refuses
// it. The reconciler answers the refusal by publishing that plan again
// under its current key, which the agent applies: the node runs its want
// again without anyone publishing it again (a fresh user's finding G2:
// the node ran nothing until a want was published by hand).
func TestRotatedKeysPlanIsPublishedAgainAfterARefusal(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ctx := m.ctx()
	n := m.newNode("ace")
	n.startAgent(nil)
	w := must(m.want(ctx, "ace", provisionerMod, mbgMod))(t)
	p1, first := must2(m.planOf(ctx, "ace", w))(t)
	must(m.settled(ctx, "ace", p1))(t)

	// The machine goes down; the deployment's key rotates meanwhile, and
	// the old key's overlap has ended by the time the agent is back.
	n.agent.stop(t)
	m.reconciler.stop(t)
	m.rc.Store(nil)
	old := m.signer.PublicKey()
	m.signer = must(store.NewSigner(must(store.NewSigningKey())(t)))(t)
	m.own = must(must(store.NewTrust(m.signer.PublicKey()))(t).Retire(old, time.Time{}))(t)
	m.trust = must(must(store.NewTrust(m.signer.PublicKey()))(t).Retire(old, time.Now().Add(-time.Minute)))(t)
	m.startReconciler()
	n.startAgent(nil)

	refused := must(m.waitEvent(ctx, "ace", events.KindSettle, func(ev events.Event) bool {
		s := ev.Payload.(*events.Settle)
		return s.Op == events.OpFailed && s.Plan == p1
	}))(t)
	if s := refused.Payload.(*events.Settle); !s.Untrusted {
		t.Fatalf("the agent's refusal of plan %d is not marked untrusted: %+v", p1, s)
	}
	p2, plan := must2(m.planOf(ctx, "ace", refused.Seq))(t)
	if !equalModules(plan.Modules, first.Modules) {
		t.Errorf("plan %d published again holds %+v", p2, plan.Modules)
	}
	must(m.settled(ctx, "ace", p2))(t)
}
