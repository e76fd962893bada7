package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
)

// 'secret put' waits, --wait long, for what NODE's provisioner did with
// the put (a fresh user's finding U7: put never said whether the node
// got the file, and right after a provisioner's kill -9 it said
// nothing). The provisioner writes, in the fill status bucket, each
// file's last fill (store.FillRecord) and why a file is not filled
// (store.FillStatus), each naming the revision of the sealed secret it
// read: the put waits for either at its own revision.

// fillWait is what a put waits for: node's file (module, path) at the
// secrets bucket's revision rev (digest: the put's), at most wait; view
// is node's view as read after the put (viewed false: none could be).
type fillWait struct {
	node, module, path string
	rev                uint64
	digest             string
	wait               time.Duration
	view               reconcile.View
	viewed             bool
}

// fillOutcome is a put's fill line ("filled on ace (digest …)" or "not
// filled yet: …") and, when the provisioner reports the file shadowed at
// the put's revision, the source that shadows it.
type fillOutcome struct {
	line       string
	shadowedBy string
}

// awaitFill waits for w's file's fill record or fill status at w.rev, at
// most w.wait, and says what it found; when neither comes, why not, as
// far as is known: no provisioner up (its view, its lease), one whose
// lease was not renewed for more than half its TTL (it may be down), the
// node's agent down, a refusal the node holds owed.
func (a *app) awaitFill(ctx context.Context, sc *secretsConn, w fillWait) fillOutcome {
	start := time.Now()
	// A provisioner the reconciler knows down and whose lease nobody
	// holds fills nothing until one starts: no wait.
	held, _, _, _, lerr := store.LeaseAge(ctx, sc.js, sc.scfg, store.ProvisionerLeaseKey(w.node), start)
	if lerr == nil && !held {
		why := fmt.Sprintf("no provisioner of %s runs (none holds its lease)", w.node)
		if w.viewed && w.view.ProvisionerDown() != nil {
			why = fmt.Sprintf("no provisioner of %s is up (the note above says since when)", w.node)
		}
		return fillOutcome{line: fmt.Sprintf("not filled yet: %s; the file is filled when 'meshfold provision %s …' starts (it fills everything on start)", why, w.node)}
	}
	if sc.fills == nil { // the first provisioner creates it
		sc.fills, _ = store.OpenFillStatus(ctx, sc.js, sc.scfg, false)
	}
	fills := sc.fills
	if fills != nil {
		// A provisioner that refuses the node's plans for their signer
		// knows no file to fill and reports none: said at once, with
		// why and what to do, not after the wait.
		if st, ok := plansUntrusted(ctx, fills, w.node); ok {
			return fillOutcome{line: untrustedLine(ctx, fills, w, st, start)}
		}
		if o, ok := watchFill(ctx, fills, w); ok {
			return o
		}
	} else {
		t := time.NewTimer(w.wait)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	return fillOutcome{line: a.unfilledWhy(ctx, sc, w)}
}

// watchFill watches w's file's fill status and fill record (two
// watches: one key each, as an operator's credentials allow) until one
// names w.rev or a newer put, at most w.wait; ok is false when none did.
func watchFill(ctx context.Context, fills jetstream.KeyValue, w fillWait) (fillOutcome, bool) {
	ctx, cancel := context.WithTimeout(ctx, w.wait)
	defer cancel()
	status, err := fills.Watch(ctx, store.SecretKey(w.node, w.module, w.path), jetstream.IgnoreDeletes())
	if err != nil {
		<-ctx.Done()
		return fillOutcome{}, false
	}
	defer status.Stop()
	filled, err := fills.Watch(ctx, store.FilledKey(w.node, w.module, w.path), jetstream.IgnoreDeletes())
	if err != nil {
		<-ctx.Done()
		return fillOutcome{}, false
	}
	defer filled.Stop()
	for {
		select {
		case <-ctx.Done():
			return fillOutcome{}, false
		case e, ok := <-filled.Updates():
			if !ok {
				return fillOutcome{}, false
			}
			if e == nil {
				continue
			}
			if r, ok := store.DecodeFillRecord(e.Value()); ok && r.Revision >= w.rev {
				return fillOutcome{line: filledLine(w, r)}, true
			}
		case e, ok := <-status.Updates():
			if !ok {
				return fillOutcome{}, false
			}
			if e == nil {
				continue
			}
			if st, ok := store.DecodeFillStatus(e.Value()); ok && st.Revision >= w.rev {
				return statusOutcome(w, st), true
			}
		}
	}
}

// filledLine says that w's put is what the node holds.
func filledLine(w fillWait, r store.FillRecord) string {
	line := fmt.Sprintf("filled on %s (digest %s)", w.node, w.digest[:16])
	switch {
	case r.Revision > w.rev:
		line = fmt.Sprintf("filled on %s with a newer put (revision %d, digest %s)", w.node, r.Revision, shortDigest(r.Digest))
	case r.Source != "sealed":
		// The source before sealed gave the same content.
		line += fmt.Sprintf(": %s gave the same content", events.Text(r.Source))
	}
	if r.Unchanged {
		line += ": it held this content already (not rewritten, no on_fill)"
	}
	return line
}

func shortDigest(d string) string {
	if len(d) > 16 {
		return d[:16]
	}
	if d == "" {
		return "-"
	}
	return d
}

// statusOutcome says why w's put is not what the node holds, from its
// provisioner's fill status st at the put's revision.
func statusOutcome(w fillWait, st store.FillStatus) fillOutcome {
	if st.State == store.FillShadowed {
		src := st.Source
		if src == "" {
			src = "an earlier source"
		}
		return fillOutcome{line: fmt.Sprintf("not filled: shadowed by %s (tried before sealed: the node holds its content)", events.Text(src)), shadowedBy: src}
	}
	line := fmt.Sprintf("not filled yet: %s: %s", st.State, events.ErrorText(st.Why))
	if !st.LastFilled.IsZero() {
		line += fmt.Sprintf("; last filled on the node at %s (gone if the node was rebooted or re-imaged since)", audit.FormatTime(st.LastFilled))
	}
	return fillOutcome{line: line}
}

// plansUntrusted returns node's trust refusal (store.GetTrustStatus) when
// it is the plans': its provisioner then holds no plan of the node,
// fills none of its files and reports no put. A refusal of knocks alone
// is not: a put reaches the provisioner without a knock.
func plansUntrusted(ctx context.Context, fills jetstream.KeyValue, node string) (store.FillStatus, bool) {
	st, ok, err := store.GetTrustStatus(ctx, fills, node)
	if err != nil || !ok || !strings.HasPrefix(st.Why, string(events.KindPlan)+" ") {
		return store.FillStatus{}, false
	}
	return st, true
}

// untrustedLine says that w's put is not filled because the node's
// provisioner refuses its plans for their signer (st: the effect, the
// key and why, from the provisioner's record), what to do, and what the
// node keeps of the file (its last fill record), as of now.
func untrustedLine(ctx context.Context, fills jetstream.KeyValue, w fillWait, st store.FillStatus, now time.Time) string {
	line := fmt.Sprintf("not filled yet: %s's provisioner refuses the node's plans for their signer (since %s ago): %s; it fills no file of %s until it trusts them (it reads its trust when it starts: restart it)",
		w.node, audit.Age(now.Sub(st.Since)), events.ErrorText(st.Why), w.node)
	if e, err := fills.Get(ctx, store.FilledKey(w.node, w.module, w.path)); err == nil {
		if r, ok := store.DecodeFillRecord(e.Value()); ok && !r.At.IsZero() {
			line += fmt.Sprintf("; last filled on the node at %s (gone if the node was rebooted or re-imaged since)", audit.FormatTime(r.At))
		}
	}
	return line
}

// unfilledWhy says why nothing came within the wait: what is
// known of the node's provisioner (its lease read again now: one not
// renewed for more than half its TTL may be down), its agent, and a
// refusal of the file the node holds owed.
func (a *app) unfilledWhy(ctx context.Context, sc *secretsConn, w fillWait) string {
	var whys []string
	now := time.Now()
	held, h, age, ttl, err := store.LeaseAge(ctx, sc.js, sc.scfg, store.ProvisionerLeaseKey(w.node), now)
	switch {
	case err != nil:
	case !held:
		whys = append(whys, fmt.Sprintf("no provisioner of %s runs now (none holds its lease): the file is filled when 'meshfold provision %s …' starts", w.node, w.node))
	case ttl > 0 && age > ttl/2:
		whys = append(whys, fmt.Sprintf("its provisioner (pid %d on %s) last renewed its lease %s ago (TTL %s; a live one renews it every %s): it may be down",
			h.PID, events.Text(h.Host), age.Round(100*time.Millisecond), ttl, ttl/4))
	}
	view, viewed := w.view, w.viewed
	if v, ok := a.nodeView(ctx, w.node); ok {
		view, viewed = v, true
	}
	if viewed {
		if view.AgentDown() {
			whys = append(whys, fmt.Sprintf("node %s's agent is down: the file is filled when it is back", w.node))
		}
		for _, o := range view.Owed {
			if o.Module == w.module && o.Path == w.path {
				whys = append(whys, fmt.Sprintf("the node refused a write of it (%s, plan #%d, from %s)", o.Reason, o.Plan, events.Text(o.Writer)))
				break
			}
		}
	}
	if len(whys) == 0 {
		whys = append(whys, fmt.Sprintf("'meshfold state %s' says it once the provisioner does", w.node))
	}
	return fmt.Sprintf("not filled yet: %s's provisioner did not report this put within %s (--wait); %s", w.node, w.wait, strings.Join(whys, "; "))
}
