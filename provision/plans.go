package provision

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// declaredSet is what a plan declares for filling: its files and the
// account the node accepts them from.
type declaredSet struct {
	plan    uint64
	account string
	files   map[FileRef]bool
}

func declaredOf(seq uint64, p *events.Plan) declaredSet {
	d := declaredSet{plan: seq, account: p.ProvisionerAccount, files: map[FileRef]bool{}}
	for _, row := range p.Modules {
		for _, f := range row.Files {
			d.files[FileRef{Module: row.Name, Path: f.Path}] = true
		}
	}
	return d
}

// settledEvent fills, once the node has settled a plan, the files it
// declares that the previous one did not (all of them when the provisioner
// account changed), and every file it declares whose last write this
// client sent was refused. Knocks only pay refused writes: without this, a
// file newly declared, and never tried, would wait for a resync or a
// restart of the client. Waiting for the settle means the node judges the
// write by the plan that declares it, so the normal path makes no refusal;
// a fill that still fails is owed and knocked as usual. The refused files
// are sent again because a knock is not guaranteed for them: a refusal
// whose owed item was paid (the module removed, then declared again) and
// that is reported again is dropped as a duplicate within JetStream's
// window, and nothing is owed (issue 14; docs/architecture.md).
func (c *Client) settledEvent(ctx context.Context, ev events.Event) {
	if st, ok := ev.Payload.(*events.Settle); ok && st.Op != events.OpFailed {
		c.settled(ctx, st.Plan)
	}
}

// settled fills what the node's newest plan declares beyond the files
// last filled, when that plan is the one the node just settled (a newer
// plan's own settle will come).
func (c *Client) settled(ctx context.Context, plan uint64) {
	m, err := c.newestPlan(ctx)
	if err != nil && !errors.Is(err, store.ErrNoMessage) && m.Event.Err == nil {
		c.log.Warn("settle seen, plan not read", "plan", plan, "err", err)
	}
	if err != nil || m.Event.Seq != plan {
		return
	}
	if err := c.checkTrust(ctx, m); err != nil {
		c.log.Error("settled plan not from a trusted reconciler: not filled", "plan", plan, "err", err)
		return
	}
	c.fillDeclared(ctx, m)
}

// fillDeclared fills what plan declares beyond the files last filled, and
// the files it declares whose last write was refused; once per plan.
func (c *Client) fillDeclared(ctx context.Context, m store.Msg) {
	seq, plan := m.Event.Seq, m.Event.Payload.(*events.Plan)
	c.passMu.Lock()
	defer c.passMu.Unlock()
	c.fillMu.Lock()
	if seq < c.declared.plan || seq <= c.settledSeen {
		c.fillMu.Unlock()
		return // a pass already read a newer plan, or this settle was handled
	}
	c.settledSeen = seq
	if seq > c.lastPlan.Event.Seq {
		c.lastPlan = m
	}
	next := declaredOf(seq, plan)
	var refs []FileRef
	retried := 0
	for _, row := range plan.Modules {
		for _, f := range row.Files {
			ref := FileRef{Module: row.Name, Path: f.Path}
			if c.declared.files[ref] && c.declared.account == next.account && !c.refused[ref] {
				continue
			}
			if c.refused[ref] {
				retried++
			}
			refs = append(refs, ref)
		}
	}
	c.declared = next
	c.forgetUndeclared()
	c.clearUndeclared(ctx)
	c.fillMu.Unlock()
	r := Report{Plan: seq}
	ctx, span := c.startSpan(ctx, time.Now(), "fill declared", m)
	defer func() { endPass(span, r) }()
	if err := c.fillFiles(ctx, &r, refs, c.isDeclared); err != nil {
		return // ctx ended it
	}
	if len(r.Filled)+len(r.Unchanged)+len(r.Refused)+len(r.Missing)+len(r.Failed) == 0 {
		return
	}
	// Say what happened: "filled them" of a pass that filled none read
	// as done (a fresh user's finding U8).
	msg := "settled plan declares new or refused files: filled them"
	switch done := len(r.Filled) + len(r.Unchanged); {
	case done == 0:
		msg = "settled plan declares new or refused files: none filled (no source, refused or failed: each file's line says why)"
	case done < len(refs):
		msg = fmt.Sprintf("settled plan declares new or refused files: filled %d of %d (the others: no source, refused or failed: each file's line says why)", done, len(refs))
	}
	c.log.Info(msg, "plan", seq, "tried", len(refs), "retried", retried, "filled", len(r.Filled), "unchanged", len(r.Unchanged),
		"refused", len(r.Refused), "missing", len(r.Missing), "failed", len(r.Failed))
	c.onFill(0, r)
}
