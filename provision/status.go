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

// lookup is what the sources said for one file: content, or why none
// gave it. It is gathered without fillMu ([Client.lookup]) and recorded
// under it ([Client.record]).
type lookup struct {
	ref     FileRef
	ticket  uint64 // the order the lookup started in (Client.ticket)
	found   bool   // a source gave content
	content []byte
	source  string     // the source that gave it ("sealed", "dir /srv/x")
	sealed  sealedRead // the sealed secret read for the file (zero: none)
	shadow  shadowing
	state   store.FillState
	whys    []string
	wheres  []string
	err     error // ctx ended it
}

// lookup asks the sources in order for ref. It touches none of the
// client's fill state: a slow source (a helper running to its
// --exec-timeout) holds no other file's fill (a fresh user's finding U16).
func (c *Client) lookup(ctx context.Context, ref FileRef) lookup {
	l := lookup{ref: ref, state: store.FillMissing}
	first := 0
	for i, src := range c.sources {
		var content []byte
		var err error
		if s, ok := src.(*Sealed); ok {
			content, l.sealed, err = s.read(ctx, c.cfg.Node, ref.Module, ref.Path)
		} else {
			content, err = src.Content(ctx, c.cfg.Node, ref.Module, ref.Path)
		}
		if err == nil {
			l.found, l.content, l.source = true, content, src.String()
			l.shadow = c.shadowWhy(ctx, i, ref.Module, ref.Path, content)
			if l.shadow.rev != 0 {
				l.sealed = sealedRead{rev: l.shadow.rev}
			}
			return l
		}
		if ctx.Err() != nil {
			l.err = ctx.Err()
			return l
		}
		var rm *RemovedError
		if errors.As(err, &rm) {
			// Removed on purpose: an older content further down must not
			// come back (a fresh user's finding 2).
			l.wheres = append(l.wheres, rm.Where)
			l.whys = append(l.whys, src.String()+": "+rm.Error())
			break
		}
		var ns *NoSourceError
		if errors.As(err, &ns) {
			l.wheres = append(l.wheres, ns.Where)
			l.whys = append(l.whys, src.String()+": "+ns.Why)
			continue
		}
		// A failed source keeps the later ones out, as a removal does:
		// a sealed secret that exists but does not open (an operator put
		// it, so what a later source holds is older and must not come
		// back on its own: a fresh user's finding F6, a rotated
		// credential rolled back to a directory's after a curve key
		// change), a sealed bucket that cannot be read (it may hold
		// such a put), a helper that timed out, could not start or
		// printed too much (it may hold a newer credential: U29). The
		// file is not written until the source answers.
		l.whys = append(l.whys, src.String()+": "+err.Error()+"; "+keepsLaterOut(err))
		l.state, first = errFillState(err), len(l.whys)-1
		break
	}
	if first > 0 {
		// The reason that names the state leads: fleet and state cut a
		// long why in its middle.
		l.whys = append(append([]string{l.whys[first]}, l.whys[:first]...), l.whys[first+1:]...)
	}
	return l
}

// record notes under fillMu what l found for its file. When no source
// gave content it returns the Unfilled saying why (also recorded in r
// and in the status bucket).
func (c *Client) record(ctx context.Context, r *Report, l lookup) *Unfilled {
	ref := l.ref
	if l.found {
		delete(c.unfilled, ref)
		delete(c.lastWhy, ref)
		return nil
	}
	un := &Unfilled{FileRef: ref, State: l.state, Why: strings.Join(l.whys, "; ")}
	un.again = c.unfilled[ref] && c.lastWhy[ref] == un.Why
	c.unfilled[ref] = true
	c.lastWhy[ref] = un.Why
	r.Unfilled = append(r.Unfilled, *un)
	if l.state == store.FillMissing {
		r.Missing = append(r.Missing, strings.Join(l.wheres, ", "))
	}
	c.setStatus(ctx, ref, un.State, un.Why, "", l.sealed.rev)
	return un
}

// shadowing is why a sealed secret is shadowed by an earlier source
// (why; "" when it is not), that source's name (source, "dir /srv/x"),
// and the revision of the sealed secret compared (rev; 0: none stored).
type shadowing struct {
	why, source string
	rev         uint64
}

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
		rec, rev, same, stored := s.compare(ctx, c.cfg.Node, module, path, content)
		if !stored || same {
			return shadowing{rev: rev}
		}
		why := fmt.Sprintf("filled from %s, tried before sealed (the --from order); the sealed secret put by %s at %s is not what the node holds: "+
			"give --from sealed before %s, or remove the file from it", c.sources[won], events.Text(rec.By), rec.At.UTC().Format(time.RFC3339), c.sources[won])
		return shadowing{why: why, source: c.sources[won].String(), rev: rev}
	}
	return shadowing{}
}

// setStatus records in the status bucket why ref is not filled (source:
// the shadowing source of [store.FillShadowed], else ""; rev: the
// revision of the sealed secret read for it, 0 for none), when it
// differs from what is recorded (a put per change, not per pass). A file
// the node was had write before (its [store.FillRecord]) says when: the
// node keeps that content (a fresh user's finding U10).
func (c *Client) setStatus(ctx context.Context, ref FileRef, state store.FillState, why, source string, rev uint64) {
	if c.cfg.Status == nil {
		return
	}
	var last time.Time
	if state != store.FillShadowed {
		last = c.filled[ref].At
	}
	old, ok := c.status[ref]
	if ok && old.State == state && old.Why == why && old.Source == source && old.Revision == rev && old.LastFilled.Equal(last) {
		return
	}
	st := store.FillStatus{V: 1, Node: c.cfg.Node, Module: ref.Module, Path: ref.Path, State: state, Why: why, Since: time.Now().UTC(), Source: source,
		Revision: rev, LastFilled: last}
	if ok && old.State == state && old.Why == why && old.Source == source {
		st.Since = old.Since // the same state, at a newer put: since it began
	}
	data, _ := json.Marshal(st)
	if _, err := c.cfg.Status.Put(ctx, store.SecretKey(c.cfg.Node, ref.Module, ref.Path), data); err != nil {
		c.statusFailed(err)
		return
	}
	c.status[ref] = st
}

// filledStatus records the status of l's file once the node holds what
// the sources gave (unchanged: it held it already): its fill record, and
// shadowed when l's shadow says why (noted in r, logged at warn when it
// changes), else no status.
func (c *Client) filledStatus(ctx context.Context, log *slog.Logger, r *Report, l lookup, unchanged bool) {
	ref, shadow := l.ref, l.shadow
	c.setFilled(ctx, l, unchanged)
	if shadow.why == "" {
		c.clearStatus(ctx, ref)
		return
	}
	r.Shadowed = append(r.Shadowed, ref)
	if old, ok := c.status[ref]; !ok || old.State != store.FillShadowed || old.Why != shadow.why {
		log.Warn("sealed secret shadowed by an earlier source", "why", shadow.why)
	}
	c.setStatus(ctx, ref, store.FillShadowed, shadow.why, shadow.source, shadow.rev)
}

// setFilled records l's file's fill ([store.FillRecord]): on every
// write, and on an unchanged one when the source or the sealed secret
// read differs from the record (a put of the content the node holds).
func (c *Client) setFilled(ctx context.Context, l lookup, unchanged bool) {
	if c.cfg.Status == nil {
		return
	}
	rec := store.FillRecord{V: 1, Node: c.cfg.Node, Module: l.ref.Module, Path: l.ref.Path, Source: l.source, Revision: l.sealed.rev,
		At: time.Now().UTC(), Unchanged: unchanged}
	if l.source == (&Sealed{}).String() {
		rec.Digest = l.sealed.digest
	}
	old, ok := c.filled[l.ref]
	if unchanged && ok && old.Source == rec.Source && old.Revision == rec.Revision && old.Digest == rec.Digest {
		return
	}
	if unchanged && ok && !old.At.IsZero() {
		rec.At = old.At // written then; held since
	}
	data, _ := json.Marshal(rec)
	if _, err := c.cfg.Status.Put(ctx, store.FilledKey(c.cfg.Node, l.ref.Module, l.ref.Path), data); err != nil {
		c.statusFailed(err)
		return
	}
	c.filled[l.ref] = rec
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
	recs, err := store.ReadFillRecords(ctx, c.cfg.Status, c.cfg.Node)
	if err != nil {
		c.statusFailed(err)
	}
	c.fillMu.Lock()
	defer c.fillMu.Unlock()
	for _, r := range recs {
		c.filled[FileRef{Module: r.Module, Path: r.Path}] = r
	}
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
	for ref := range c.filled {
		if c.declared.files[ref] {
			continue
		}
		if err := c.cfg.Status.Delete(ctx, store.FilledKey(c.cfg.Node, ref.Module, ref.Path)); err != nil {
			c.statusFailed(err)
			continue
		}
		delete(c.filled, ref)
	}
}

// statusFailed logs a failed status write, once until one succeeds.
func (c *Client) statusFailed(err error) {
	if !c.statusWarn {
		c.statusWarn = true
		c.log.Warn("fill status not recorded (fleet and state will not show why a file is unfilled)", "err", err)
	}
}

// retryUnfilled tries the files no source gave, and the shadowed ones,
// again every RetryUnfilled, until ctx is done: a restored source is
// filled then, and a put once the source that shadowed it lost the file.
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
		var refs []FileRef
		for ref := range c.unfilled {
			if !c.declared.files[ref] {
				delete(c.unfilled, ref)
				continue
			}
			refs = append(refs, ref)
		}
		// A shadowed file too: the source that shadows the put may lose
		// the file (a deleted Vault entry), and the put is then what the
		// node must hold, within this interval, not at the next resync (a
		// fresh user's finding U9).
		shadowed := map[FileRef]bool{}
		for ref, st := range c.status {
			if st.State == store.FillShadowed && c.declared.files[ref] && !c.unfilled[ref] {
				shadowed[ref] = true
				refs = append(refs, ref)
			}
		}
		c.fillMu.Unlock()
		if err := c.fillFiles(ctx, &r, refs, c.isDeclared); err != nil {
			return // ctx ended it
		}
		unchanged := 0
		for _, ref := range r.Unchanged {
			if !shadowed[ref] {
				unchanged++
			}
		}
		// Reported only when a source gave something new: a file still
		// unfilled was reported (and logged) when it became so, and a
		// shadowed file still filled from its source is not news.
		if len(r.Filled)+unchanged+len(r.Refused) > 0 {
			c.log.Info("files no source gave, or filled from a source that shadowed a put, are sent now", "filled", len(r.Filled), "unchanged", unchanged, "refused", len(r.Refused))
			c.onFill(0, r)
		}
	}
}
