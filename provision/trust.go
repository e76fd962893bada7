package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meshfold/meshfold/store"
)

// checkTrust verifies m's signature ([Client.verify]) and keeps the fill
// status bucket's record of the node's trust refusal (store.FillUntrusted,
// under store.TrustStatusKey) as it says: a plan or knock refused for its
// signer (a key --trust does not name, one retired past its overlap, or
// none: store.ErrUntrusted, ErrRetired, ErrUnsigned) is recorded, once per
// cause (the key and why), and one accepted deletes the record. Without
// it, only this client's log said why no file of the node was filled and
// no knock answered: `fleet`, `state`, `poke` and the console asked
// whether a provisioner was running (a fresh user's finding G6). A
// signature that does not verify (an altered or copied effect) is only
// logged: no --trust fixes it, and the reconciler publishes its own
// effect again.
func (c *Client) checkTrust(ctx context.Context, m store.Msg) error {
	err := c.verify(m)
	if c.cfg.Trust == nil || c.cfg.Status == nil {
		return err
	}
	switch {
	case err == nil:
		c.trusted(ctx)
	case errors.Is(err, store.ErrUntrusted), errors.Is(err, store.ErrRetired), errors.Is(err, store.ErrUnsigned):
		c.untrusted(ctx, m, err)
	}
	return err
}

// untrusted records that m was refused for its signer (err says why),
// unless the record holds that cause already.
func (c *Client) untrusted(ctx context.Context, m store.Msg, err error) {
	cause := untrustedCause(m.Signer, err)
	c.trustMu.Lock()
	defer c.trustMu.Unlock()
	if old := c.trustRec; old != nil && old.Signer == m.Signer && strings.HasSuffix(old.Why, cause) {
		return // the same cause: written once, not per plan or knock
	}
	st := store.FillStatus{V: 1, Node: c.cfg.Node, State: store.FillUntrusted, Signer: m.Signer, Since: time.Now().UTC(),
		Why: fmt.Sprintf("%s #%d %s", m.Event.Kind, m.Event.Seq, cause)}
	data, _ := json.Marshal(st)
	if _, err := c.cfg.Status.Put(ctx, store.TrustStatusKey(c.cfg.Node), data); err != nil {
		c.trustFailed(ctx, err)
		return
	}
	c.trustWarn = false
	c.trustRec = &st
	c.log.Warn("recorded for fleet, state and poke: this provisioner refuses the node's plans and knocks for their signer",
		"why", st.Why, "trusted", c.cfg.Trust.String())
}

// trusted deletes the record of a trust refusal once a plan or knock is
// accepted again.
func (c *Client) trusted(ctx context.Context) {
	c.trustMu.Lock()
	defer c.trustMu.Unlock()
	if c.trustRec == nil {
		return
	}
	if err := c.cfg.Status.Delete(ctx, store.TrustStatusKey(c.cfg.Node)); err != nil {
		c.trustFailed(ctx, err)
		return
	}
	c.trustWarn = false
	c.log.Info("plans and knocks trusted again: the record of their refusal is deleted", "was", c.trustRec.Why)
	c.trustRec = nil
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
		return "is not signed: this provisioner acts only on signed plans and knocks, which a reconciler of this version publishes (not an older one, nor a hand's)"
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
