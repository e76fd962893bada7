package provision_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/provision"
	"github.com/meshfold/meshfold/store"
)

// A provisioner whose --trust does not name the reconciler's key records
// why it refuses the node's plans and knocks in the fill status bucket
// (state untrusted, under store.TrustStatusKey, naming the key and the
// fix), where fleet, state and poke read it, instead of only logging it
// (a fresh user's finding G6: they asked whether a provisioner ran). It
// writes the record once per cause, not per plan or knock: another knock
// of the same key leaves it as it is, and so does an unsigned knock, since
// the plans' refusal leads. A plan it trusts, arriving and settling, is
// filled, and the record then says the knocks' refusal, until a knock it
// trusts deletes it; a provisioner restarted with the wrong trust records
// it again, and one restarted with the right trust deletes it on start.
func TestUntrustedKeyRecordedAndCleared(t *testing.T) {
	e := newSealedEnv(t)
	newKey := func() (*store.Signer, *store.Trust) {
		t.Helper()
		kp, err := store.NewSigningKey()
		if err != nil {
			t.Fatal(err)
		}
		s, err := store.NewSigner(kp)
		if err != nil {
			t.Fatal(err)
		}
		trust, err := store.NewTrust(s.PublicKey())
		if err != nil {
			t.Fatal(err)
		}
		return s, trust
	}
	reconciler, reconcilerTrust := newKey() // the reconciler's key
	other, otherTrust := newKey()           // the key the provisioner trusts
	n := 0
	signed := func(s *store.Signer, p events.Payload) uint64 {
		t.Helper()
		n++
		ack, err := e.pub.Append(ctxT(t), "ace", events.Stamp(p, time.Now()),
			store.WithMsgID(fmt.Sprintf("ace.%s.%d.0", p.Kind(), n)), store.WithSigner(s))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Seq
	}
	row := events.PlanModule{Name: mbg, Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: creds, Mode: "0600"}}}
	plan := func(s *store.Signer, build string) uint64 {
		row.Build = build
		return signed(s, &events.Plan{Cause: 1, Want: 1, ProvisionerAccount: "prov", Modules: []events.PlanModule{row}})
	}
	knock := &events.Knock{Cause: 2, Reasons: []events.KnockReason{events.KnockOperator}, Owed: []events.Owed{}}
	p1 := plan(reconciler, "g:1")
	e.settled(t, p1)
	from := t.TempDir()
	source(t, from, mbg, creds, secret)
	start := func(trust *store.Trust) (stop func()) {
		t.Helper()
		c := e.client(t, from, nil, func(cfg *provision.Config) {
			cfg.Trust, cfg.Status, cfg.Resync, cfg.RetryUnfilled = trust, e.status, -1, -1
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		stopped := false
		stop = func() {
			if stopped {
				return
			}
			stopped = true
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(wait):
				t.Errorf("Run did not return")
			}
		}
		t.Cleanup(stop)
		return stop
	}
	record := func(what string, pred func(store.FillStatus) bool) jetstream.KeyValueEntry {
		t.Helper()
		var rec store.FillStatus
		e.waitStatus(t, what, func(sts []store.FillStatus) bool {
			for _, st := range sts {
				if st.Module == "" && st.Path == "" {
					rec = st
					return pred(st)
				}
			}
			return false
		})
		noLeak(t, rec.Why, rec.Signer)
		if shown := events.ErrorText(rec.Why); shown != rec.Why {
			t.Errorf("%s: the why is cut where state and fleet show it: %s", what, shown)
		}
		entry, err := e.status.Get(ctxT(t), store.TrustStatusKey("ace"))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return entry
	}
	filled := func() bool {
		b, err := os.ReadFile(filepath.Join(e.root, creds))
		return err == nil && string(b) == secret
	}

	stop := start(otherTrust)
	first := record("the newest plan's refusal recorded", func(st store.FillStatus) bool {
		return st.State == store.FillUntrusted && st.Signer == reconciler.PublicKey() &&
			strings.HasPrefix(st.Why, fmt.Sprintf("plan #%d is signed by key %s, which this provisioner does not trust", p1, reconciler.PublicKey())) &&
			strings.Contains(st.Why, "add it to --trust (MESHFOLD_TRUST)")
	})
	unchanged := func(what string, after uint64) {
		t.Helper()
		waitfor.Until(t, wait, what+": its refusal logged", func() bool {
			for _, l := range strings.Split(e.logs.String(), "\n") {
				if strings.Contains(l, "knock ignored: not from a trusted reconciler") && strings.Contains(l, fmt.Sprintf(" knock=%d ", after)) {
					return true
				}
			}
			return false
		})
		again, err := e.status.Get(ctxT(t), store.TrustStatusKey("ace"))
		if err != nil {
			t.Fatalf("the record after %s: %v", what, err)
		}
		if again.Revision() != first.Revision() {
			t.Fatalf("the record after %s: revision %d, want %d unchanged (written once a cause):\n%s", what, again.Revision(), first.Revision(), again.Value())
		}
	}
	// A knock of the same key: the same cause, nothing written. An
	// unsigned one: the plan's refusal leads (nothing is filled while
	// the newest plan is refused), nothing written either.
	unchanged("a knock of the same key", signed(reconciler, knock))
	k2 := e.append(t, knock)
	unchanged("an unsigned knock", k2)
	if filled() {
		t.Fatal("a file was filled from a plan the provisioner does not trust")
	}
	// A plan of the key it trusts settles: it is filled, and the record
	// says the knocks' refusal, which stands until a knock is accepted
	// (none is answered until then).
	p2 := plan(other, "g:2")
	e.settled(t, p2)
	waitfor.Until(t, wait, "the trusted plan's file filled", filled)
	record("the knocks' refusal recorded once the plan is trusted", func(st store.FillStatus) bool {
		return st.Signer == "" && strings.HasPrefix(st.Why, fmt.Sprintf("knock #%d is not signed", k2))
	})
	signed(other, knock)
	e.waitStatus(t, "the record deleted once a trusted knock arrived", func(sts []store.FillStatus) bool { return len(sts) == 0 })
	stop()

	// Restarted with the wrong trust (a stale trust file) against a plan
	// of the reconciler's key: recorded again, on start.
	if err := os.Remove(filepath.Join(e.root, creds)); err != nil {
		t.Fatal(err)
	}
	p3 := plan(reconciler, "g:3")
	e.settled(t, p3)
	stop = start(otherTrust)
	record("the refusal recorded on start", func(st store.FillStatus) bool {
		return st.Signer == reconciler.PublicKey() && strings.HasPrefix(st.Why, fmt.Sprintf("plan #%d is signed by key %s", p3, reconciler.PublicKey()))
	})
	stop()
	if filled() {
		t.Fatal("a file was filled from a plan the provisioner does not trust")
	}
	// Restarted with the right trust: the record is deleted on start.
	start(reconcilerTrust)
	e.waitStatus(t, "the record deleted by a provisioner that trusts the key", func(sts []store.FillStatus) bool { return len(sts) == 0 })
	waitfor.Until(t, wait, "the file filled", filled)
	noLeak(t, e.logs.String())
}
