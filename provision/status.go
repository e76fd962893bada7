package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// content asks the sources in order for module's file path. When none
// gives content it returns the Unfilled saying why (also recorded in r
// and in the status bucket); err only when ctx ended it. With content,
// shadow says why a sealed secret after the source that gave it is
// shadowed ([Client.shadowWhy]; zero when none is).
func (c *Client) content(ctx context.Context, r *Report, module, path string) ([]byte, *Unfilled, shadowing, error) {
	ref := FileRef{Module: module, Path: path}
	var whys, wheres []string
	state, first := store.FillMissing, 0
	for i, src := range c.sources {
		content, err := src.Content(ctx, c.cfg.Node, module, path)
		if err == nil {
			delete(c.unfilled, ref)
			delete(c.lastWhy, ref)
			return content, nil, c.shadowWhy(ctx, i, module, path, content), nil
		}
		if ctx.Err() != nil {
			return nil, nil, shadowing{}, ctx.Err()
		}
		var rm *RemovedError
		if errors.As(err, &rm) {
			// Removed on purpose: an older content further down must not
			// come back (a fresh user's finding 2).
			wheres = append(wheres, rm.Where)
			whys = append(whys, src.String()+": "+rm.Error())
			break
		}
		var ns *NoSourceError
		if errors.As(err, &ns) {
			wheres = append(wheres, ns.Where)
			whys = append(whys, src.String()+": "+ns.Why)
			continue
		}
		whys = append(whys, src.String()+": "+err.Error())
		if state == store.FillMissing {
			state, first = errFillState(err), len(whys)-1 // the first failure names the state
		}
		// A failed source keeps the later ones out, as a removal does:
		// a sealed secret that exists but does not open (an operator put
		// it, so what a later source holds is older and must not come
		// back on its own: a fresh user's finding F6, a rotated
		// credential rolled back to a directory's after a curve key
		// change), a sealed bucket that cannot be read (it may hold
		// such a put), a helper that timed out, could not start or
		// printed too much (it may hold a newer credential: U29). The
		// file keeps its content until the source answers.
		whys[len(whys)-1] += "; " + keepsLaterOut(err)
		break
	}
	if first > 0 {
		// The reason that names the state leads: fleet and state cut a
		// long why in its middle.
		whys = append(append([]string{whys[first]}, whys[:first]...), whys[first+1:]...)
	}
	un := &Unfilled{FileRef: ref, State: state, Why: strings.Join(whys, "; ")}
	un.again = c.unfilled[ref] && c.lastWhy[ref] == un.Why
	c.unfilled[ref] = true
	c.lastWhy[ref] = un.Why
	r.Unfilled = append(r.Unfilled, *un)
	if state == store.FillMissing {
		r.Missing = append(r.Missing, strings.Join(wheres, ", "))
	}
	c.setStatus(ctx, ref, un.State, un.Why, "")
	return nil, un, shadowing{}, nil
}

// shadowing is why a sealed secret is shadowed by an earlier source
// (why; "" when it is not) and that source's name (source, "dir /srv/x").
type shadowing struct{ why, source string }

// shadowWhy says why the sealed secret of module's file path is shadowed
// by the source at index won, which gave content: a sealed source after
// it holds a secret for the file (not a removal) whose content differs
// or does not open, so the put is not what the node holds (a fresh
// user's finding F7: --from DIR before --from sealed, and a put said
// nothing). "" when no sealed source follows, none is stored, or it
// holds the same content. The content is compared, never logged.
func (c *Client) shadowWhy(ctx context.Context, won int, module, path string, content []byte) shadowing {
	for _, src := range c.sources[won+1:] {
		s, ok := src.(*Sealed)
		if !ok {
			continue
		}
		rec, same, stored := s.compare(ctx, c.cfg.Node, module, path, content)
		if !stored || same {
			return shadowing{}
		}
		why := fmt.Sprintf("filled from %s, tried before sealed (the --from order); the sealed secret put by %s at %s is not what the node holds: "+
			"give --from sealed before %s, or remove the file from it", c.sources[won], events.Text(rec.By), rec.At.UTC().Format(time.RFC3339), c.sources[won])
		return shadowing{why: why, source: c.sources[won].String()}
	}
	return shadowing{}
}

// setStatus records in the status bucket why ref is not filled (source:
// the shadowing source of [store.FillShadowed], else ""), when it
// differs from what is recorded (a put per change, not per pass).
func (c *Client) setStatus(ctx context.Context, ref FileRef, state store.FillState, why, source string) {
	if c.cfg.Status == nil {
		return
	}
	old, ok := c.status[ref]
	if ok && old.State == state && old.Why == why && old.Source == source {
		return
	}
	st := store.FillStatus{V: 1, Node: c.cfg.Node, Module: ref.Module, Path: ref.Path, State: state, Why: why, Since: time.Now().UTC(), Source: source}
	data, _ := json.Marshal(st)
	if _, err := c.cfg.Status.Put(ctx, store.SecretKey(c.cfg.Node, ref.Module, ref.Path), data); err != nil {
		c.statusFailed(err)
		return
	}
	c.status[ref] = st
}

// filledStatus records the status of ref once the node holds what the
// sources gave: shadowed when shadow says why (noted in r, logged at warn
// when it changes), else none.
func (c *Client) filledStatus(ctx context.Context, log *slog.Logger, r *Report, ref FileRef, shadow shadowing) {
	if shadow.why == "" {
		c.clearStatus(ctx, ref)
		return
	}
	r.Shadowed = append(r.Shadowed, ref)
	if old, ok := c.status[ref]; !ok || old.State != store.FillShadowed || old.Why != shadow.why {
		log.Warn("sealed secret shadowed by an earlier source", "why", shadow.why)
	}
	c.setStatus(ctx, ref, store.FillShadowed, shadow.why, shadow.source)
}

// clearStatus deletes ref's status once it is filled.
func (c *Client) clearStatus(ctx context.Context, ref FileRef) {
	if c.cfg.Status == nil {
		return
	}
	if _, ok := c.status[ref]; !ok {
		return
	}
	if err := c.cfg.Status.Delete(ctx, store.SecretKey(c.cfg.Node, ref.Module, ref.Path)); err != nil {
		c.statusFailed(err)
		return
	}
	delete(c.status, ref)
}

// loadStatus reads what the status bucket holds for this node (a
// previous run's), so that a file filled now clears it.
func (c *Client) loadStatus(ctx context.Context) {
	if c.cfg.Status == nil {
		return
	}
	sts, err := store.ReadFillStatus(ctx, c.cfg.Status, c.cfg.Node)
	if err != nil {
		c.statusFailed(err)
	}
	c.fillMu.Lock()
	defer c.fillMu.Unlock()
	for _, st := range sts {
		if st.Module == "" {
			if st.State == store.FillUntrusted {
				// A previous run's trust refusal: the first plan or
				// knock this run accepts deletes it (checkTrust).
				c.trustMu.Lock()
				c.trustRec = &st
				c.trustMu.Unlock()
			}
			continue // no file's
		}
		c.status[FileRef{Module: st.Module, Path: st.Path}] = st
	}
}

// clearUndeclared deletes the statuses of files the declared plan no
// longer names.
func (c *Client) clearUndeclared(ctx context.Context) {
	for ref := range c.status {
		if !c.declared.files[ref] {
			c.clearStatus(ctx, ref)
		}
	}
}

// statusFailed logs a failed status write, once until one succeeds.
func (c *Client) statusFailed(err error) {
	if !c.statusWarn {
		c.statusWarn = true
		c.log.Warn("fill status not recorded (fleet and state will not show why a file is unfilled)", "err", err)
	}
}

// retryUnfilled tries the files no source gave again every
// RetryUnfilled, until ctx is done: a restored source is filled then.
func (c *Client) retryUnfilled(ctx context.Context) {
	if c.cfg.RetryUnfilled < 0 {
		return
	}
	t := time.NewTicker(c.cfg.RetryUnfilled)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.fillMu.Lock()
		r := Report{Plan: c.declared.plan}
		for ref := range c.unfilled {
			if !c.declared.files[ref] {
				delete(c.unfilled, ref)
				continue
			}
			if err := c.fillFile(ctx, &r, ref.Module, ref.Path); err != nil {
				break // ctx ended it
			}
		}
		c.fillMu.Unlock()
		// Reported only when a source gave something: a file still
		// unfilled was reported (and logged) when it became so.
		if len(r.Filled)+len(r.Unchanged)+len(r.Refused) > 0 {
			c.log.Info("files no source gave are sent now", "filled", len(r.Filled), "unchanged", len(r.Unchanged), "refused", len(r.Refused))
			if c.cfg.OnFill != nil {
				c.cfg.OnFill(0, r)
			}
		}
	}
}
