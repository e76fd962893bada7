package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// checkTrust verifies m's signature ([Client.verify]) and keeps the fill
// status bucket's record of the node's trust refusal (store.FillUntrusted,
// under store.TrustStatusKey) as it says. Without it, only this client's
// log said why no file of the node was filled and no knock answered:
// `fleet`, `state`, `poke` and the console asked whether a provisioner
// was running (a fresh user's finding G6).
//
// A plan or knock refused for its signer (a key --trust does not name,
// one retired past its overlap, or none: store.ErrUntrusted, ErrRetired,
// ErrUnsigned) is the newest refusal of its kind until an effect of that
// kind is accepted. The record says the plans' refusal, else the
// knocks', and is deleted when neither kind's newest effect was refused:
// a knock accepted while the newest plan is refused still fills nothing,
// and a plan accepted while knocks are refused answers none. It is
// written when its cause (the key, and why it is refused) changes, not
// per plan or knock. A signature that does not verify (an altered or
// copied effect) is only logged: no --trust fixes it, and the reconciler
// publishes its own effect again.
func (c *Client) checkTrust(ctx context.Context, m store.Msg) error {
	err := c.verify(m)
	if c.cfg.Trust == nil || c.cfg.Status == nil {
		return err
	}
	switch {
	case err == nil:
		c.trustMu.Lock()
		delete(c.trustBad, m.Event.Kind)
		c.syncTrust(ctx)
		c.trustMu.Unlock()
	case errors.Is(err, store.ErrUntrusted), errors.Is(err, store.ErrRetired), errors.Is(err, store.ErrUnsigned):
		st := store.FillStatus{V: 1, Node: c.cfg.Node, State: store.FillUntrusted, Signer: m.Signer, Since: time.Now().UTC(),
			Why: fmt.Sprintf("%s #%d %s", m.Event.Kind, m.Event.Seq, untrustedCause(m.Signer, err))}
		c.trustMu.Lock()
		if old, ok := c.trustBad[m.Event.Kind]; !ok || !sameCause(old, st) {
			c.trustBad[m.Event.Kind] = st // the first of its cause: its effect and time
		}
		c.syncTrust(ctx)
		c.trustMu.Unlock()
	}
	return err
}

// sameCause reports whether two trust refusals have one cause: the same
// signer, refused for the same reason, whichever effect named it.
func sameCause(a, b store.FillStatus) bool {
	causeOf := func(why string) string {
		if i := strings.Index(why, " is "); i >= 0 {
			return why[i:]
		}
		return why
	}
	return a.Signer == b.Signer && causeOf(a.Why) == causeOf(b.Why)
}

// syncTrust writes the record that c.trustBad calls for (its plan's
// refusal, else its knock's, else none) when the bucket holds another
// cause; c.trustMu is held.
func (c *Client) syncTrust(ctx context.Context) {
	want, ok := c.trustBad[events.KindPlan]
	if !ok {
		want, ok = c.trustBad[events.KindKnock]
	}
	old := c.trustRec
	switch {
	case !ok && old == nil:
		return
	case !ok:
		if err := c.cfg.Status.Delete(ctx, store.TrustStatusKey(c.cfg.Node)); err != nil {
			c.trustFailed(ctx, err)
			return
		}
		c.trustWarn = false
		c.trustRec = nil
		c.log.Info("plans and knocks trusted again: the record of their refusal is deleted", "was", old.Why)
	case old != nil && sameCause(*old, want):
		return // written once a cause, not per plan or knock
	default:
		data, _ := json.Marshal(want)
		if _, err := c.cfg.Status.Put(ctx, store.TrustStatusKey(c.cfg.Node), data); err != nil {
			c.trustFailed(ctx, err)
			return
		}
		c.trustWarn = false
		c.trustRec = &want
		c.log.Warn("recorded for fleet, state and poke: this provisioner refuses the node's plans or knocks for their signer",
			"why", want.Why, "trusted", c.cfg.Trust.String())
	}
}

// trustFailed logs a failed write of the trust record, once until one
// succeeds; c.trustMu is held.
func (c *Client) trustFailed(ctx context.Context, err error) {
	if ctx.Err() == nil && !c.trustWarn {
		c.trustWarn = true
		c.log.Warn("trust refusal not recorded (fleet, state and poke will not say why no file is filled)", "err", err)
	}
}

// untrustedCause says why an effect signed by signer was refused (err,
// from store.Trust.Verify) and what to do, after the effect's name: the
// part of the record's why that names its cause. It is short enough
// (under 200 bytes with a sequence of up to 10 digits) that `state`,
// `fleet` and `poke` show it whole (events.ErrorText cuts longer text
// in its middle, where the key is); the keys this provisioner trusts are
// in its log line and its start's.
func untrustedCause(signer string, err error) string {
	switch {
	case errors.Is(err, store.ErrUnsigned):
		return "is not signed: this provisioner acts only on signed plans and knocks (a reconciler of this version signs each; an older one's, or one published by hand, is not)"
	case errors.Is(err, store.ErrRetired):
		since := ""
		if _, s, ok := strings.Cut(err.Error(), "(since "); ok {
			since = " (since " + s
		}
		return "is signed by key " + signer + ", retired past its overlap" + since + " in this provisioner's --trust"
	default:
		return "is signed by key " + signer + ", which this provisioner does not trust: if it is the reconciler's, add it to --trust (MESHFOLD_TRUST)"
	}
}
