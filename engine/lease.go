package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
)

// A partition's lease, from its creation to its release or loss: what
// [Group] holds for each partition it was granted.

// leaseView is the last the watch said of one lease key.
type leaseView struct {
	present bool
	holder  string
	created time.Time // the server's time of that revision
}

// live reports whether the lease v describes exists and is another
// instance's than self: present, held by someone else, and renewed
// within the last 1.25 TTL (a live holder renews every TTL/6 at most;
// an older entry's key has expired, whatever the watch said since).
func (v leaseView) live(self string, ttl time.Duration, now time.Time) bool {
	return v.present && v.holder != self && !stale(v.created, ttl, now)
}

// stale reports whether an entry the server stored at created is older,
// at now, than any live holder lets its key get.
func stale(created time.Time, ttl time.Duration, now time.Time) bool {
	return now.Sub(created) > ttl+ttl/4
}

// lease is a lease this instance holds (or owned, until its partition
// stopped).
type lease struct {
	p       int
	rev     uint64
	value   []byte
	ctx     context.Context
	revoke  context.CancelCauseFunc
	stopped chan struct{}
	timer   *time.Timer

	mu       sync.Mutex
	deadline time.Time

	releasing bool      // revoked with ErrReleased: delete once stopped
	renewing  bool      // a renewal is in flight
	next      time.Time // when the next renewal is due
	// unanswered: a renewal got no answer since the last one answered (a
	// timeout: the server may have stored it), the first of them sent at
	// unansweredSince. A renewal refused as stale then first looks
	// whether the bucket holds one of them (ownStored).
	unanswered      bool
	unansweredSince time.Time
}

// createAttempt is a create of a partition's lease that got no answer
// (a timeout: the server may have stored it): its value, unique to the
// attempt (leaseValue.Since), and when it was sent.
type createAttempt struct {
	value []byte
	sent  time.Time
}

// extend moves the lease's deadline to d when d is later. Loop only.
func (l *lease) extend(d time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d.After(l.deadline) {
		l.deadline = d
		l.timer.Reset(time.Until(d))
	}
}

func (l *lease) valid() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Now().Before(l.deadline)
}

func (l *lease) isStopped() bool {
	select {
	case <-l.stopped:
		return true
	default:
		return false
	}
}

// leaseValue is what a lease or member key holds: for people reading
// the bucket (`nats kv get MESH_LEASES lease.3`).
type leaseValue struct {
	Group    string    `json:"group"`
	Instance string    `json:"instance"`
	Since    time.Time `json:"since,omitzero"`
}

// acquire tries to create the leases of partitions ps, concurrently,
// then hands the results to the loop at once. pending holds, for each of
// ps, its creates that got no answer: a create refused because the key
// exists takes the lease when the bucket holds one of them (ownStored),
// instead of waiting out the TTL of a lease this instance created.
func (g *Group) acquire(ctx context.Context, ps []int, pending [][]createAttempt) {
	val, _ := json.Marshal(leaseValue{Group: g.cfg.Name, Instance: g.cfg.Instance, Since: time.Now().UTC()})
	revs := make([]uint64, len(ps))
	errs := make([]error, len(ps))
	adopted := make([]*createAttempt, len(ps))
	sent := time.Now()
	actx, cancel := context.WithTimeout(ctx, g.opTimeout())
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A create the server's permissions deny fails with the
			// denial, which warnUnacquired names, not at its timeout.
			gctx, release := store.GuardDenied(actx, g.nc, "$KV."+g.cfg.Stream.Name+LeaseBucketSuffix+"."+leaseKey(p))
			revs[i], errs[i] = g.kv.Create(gctx, leaseKey(p), val)
			if cause := context.Cause(gctx); errs[i] != nil && errors.Is(cause, nats.ErrPermissionViolation) {
				errs[i] = cause
			}
			release()
			if !errors.Is(errs[i], jetstream.ErrKeyExists) {
				return
			}
			for _, a := range pending[i] {
				// One with too little of its TTL left to renew it in time
				// is left to expire.
				if time.Until(a.sent.Add(g.ttl-g.margin())) <= g.opTimeout()+retryEvery {
					continue
				}
				if rev, _ := g.ownStored(ctx, leaseKey(p), a.value, 0); rev > 0 {
					revs[i], errs[i], adopted[i] = rev, nil, &a
					return
				}
			}
		}()
	}
	wg.Wait()
	cancel()
	g.post(func() {
		for i, p := range ps {
			g.acquiring[p] = false
			err := errs[i]
			switch {
			case err == nil:
				delete(g.pending, p)
			case store.Unanswered(err):
				g.pending[p] = append(g.livePending(p), createAttempt{value: val, sent: sent})
			}
			g.acquired(p, err)
			if err != nil {
				g.tryAt[p] = time.Now().Add(retryEvery)
				if !errors.Is(err, jetstream.ErrKeyExists) {
					g.log.Debug("acquire partition lease", "partition", p, "err", err)
				}
				continue
			}
			if a := adopted[i]; a != nil {
				g.log.Info("partition lease created by a create that got no answer: taken", "partition", p, "revision", revs[i])
				g.grant(p, revs[i], a.value, a.sent)
				continue
			}
			g.grant(p, revs[i], val, sent)
		}
		g.warnUnacquired()
		g.setOwned()
	})
}

// acquireWarnEvery is the least time between two warnings that partitions
// of a member's share could not be acquired.
const acquireWarnEvery = 10 * time.Second

// unacquired is a partition of this member's share whose lease it has
// failed to create since first, last with err. refused is the last
// refusal among those failures (a denial, …: an answer, neither a lease
// that exists nor [store.Unanswered]): a create whose denial came after
// its own deadline fails with the timeout, which says nothing of why.
type unacquired struct {
	first   time.Time
	err     error
	refused error
	warned  bool
}

// cause is what a warning names for u: its last failure, or, when that
// got no answer, the last refusal of its failing period. rank orders
// causes by what they tell an operator: a refusal, then no answer, then
// a lease that exists.
func (u *unacquired) cause() (err error, rank int) {
	switch {
	case errors.Is(u.err, jetstream.ErrKeyExists):
		return u.err, 0
	case store.Unanswered(u.err) && u.refused != nil:
		return u.refused, 2
	case store.Unanswered(u.err):
		return u.err, 1
	}
	return u.err, 2
}

// acquired records the outcome of a create of partition p's lease: err
// nil, taken. Loop only.
func (g *Group) acquired(p int, err error) {
	u := g.failing[p]
	if err == nil {
		if u != nil && u.warned {
			g.log.Info("partition lease acquired after failing", "partition", p, "after", time.Since(u.first).Round(time.Millisecond))
		}
		delete(g.failing, p)
		return
	}
	if u == nil {
		u = &unacquired{first: time.Now()}
		g.failing[p] = u
	}
	u.err = err
	if !errors.Is(err, jetstream.ErrKeyExists) && !store.Unanswered(err) {
		u.refused = err
	}
}

// warnUnacquired warns, at most every acquireWarnEvery, of the partitions
// of this member's share whose lease it cannot create: those refused for
// another reason than a lease that exists (the bucket without a leader
// or unreachable, a denial), with the cause (a refusal in the failing
// period before a timeout: unacquired.cause); and those a lease that
// exists has kept from it for longer than a holder that stopped renewing
// keeps it (stale: 1.25 TTL), which should have expired. A lease that
// exists for less (a dead member's, until its TTL) is the group's
// ordinary wait and stays at debug level. Forgets the partitions no
// longer its share. Loop only.
func (g *Group) warnUnacquired() {
	share := assign(g.memberList(), g.n)
	now := time.Now()
	var ps []int
	var cause error
	rank := -1
	var since time.Time
	for _, p := range slices.Sorted(maps.Keys(g.failing)) {
		u := g.failing[p]
		if share.owner(p) != g.cfg.Instance || g.mine[p] != nil {
			delete(g.failing, p)
			continue
		}
		if errors.Is(u.err, jetstream.ErrKeyExists) && !stale(u.first, g.ttl, now) {
			continue
		}
		ps = append(ps, p)
		if c, r := u.cause(); r > rank {
			cause, rank = c, r
		}
		if since.IsZero() || u.first.Before(since) {
			since = u.first
		}
	}
	if len(ps) == 0 || now.Before(g.acquireWarnNext) {
		return
	}
	g.acquireWarnNext = now.Add(acquireWarnEvery)
	for _, p := range ps {
		g.failing[p].warned = true
	}
	g.log.Warn("partition leases of this member's share not acquired; retrying", "partitions", ps,
		"failing_for", now.Sub(since).Round(time.Millisecond), "err", cause)
}

// livePending forgets partition p's unanswered creates that no lease can
// be held by any more (sent a TTL ago or more) and returns the others.
func (g *Group) livePending(p int) []createAttempt {
	live := slices.DeleteFunc(g.pending[p], func(a createAttempt) bool { return time.Since(a.sent) >= g.ttl })
	if len(live) == 0 {
		delete(g.pending, p)
		return nil
	}
	g.pending[p] = live
	return live
}

// ownStored reports the revision, newer than after, at which the bucket
// holds key with value: a write of this instance's that got no answer
// (its reply lost to a timeout on a loaded or electing cluster) but that
// the server stored. value is unique to this instance's lease (it holds
// the time of its creation), and nobody else writes it. 0: the bucket
// holds something else, or the read failed (err).
func (g *Group) ownStored(ctx context.Context, key string, value []byte, after uint64) (uint64, error) {
	gctx, cancel := context.WithTimeout(ctx, g.opTimeout())
	defer cancel()
	e, err := g.kv.Get(gctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if e.Operation() != jetstream.KeyValuePut || e.Revision() <= after || !bytes.Equal(e.Value(), value) {
		return 0, nil
	}
	return e.Revision(), nil
}

// grant records an acquired lease and hands it to the reconciler.
func (g *Group) grant(p int, rev uint64, val []byte, sent time.Time) {
	lctx, revoke := context.WithCancelCause(context.Background())
	l := &lease{p: p, rev: rev, value: val, ctx: lctx, revoke: revoke, stopped: make(chan struct{}),
		deadline: sent.Add(g.ttl - g.margin()), next: sent.Add(g.renewEvery())}
	l.timer = time.AfterFunc(time.Until(l.deadline), func() {
		l.revoke(fmt.Errorf("%w: not renewed within its TTL", ErrLeaseLost))
		g.poke()
	})
	g.mine[p] = l
	g.view[p] = leaseView{present: true, holder: g.cfg.Instance, created: sent}
	var once sync.Once
	gr := Grant{Partition: p, Revoked: lctx, Valid: l.valid, Stopped: func() {
		once.Do(func() { close(l.stopped); g.poke() })
	}}
	if g.closing {
		l.releasing = true
		l.revoke(ErrReleased)
		gr.Stopped()
		return
	}
	g.log.Debug("partition acquired", "partition", p)
	g.grants <- gr // never blocks: at most one grant a partition is outstanding
}

// renew renews, asynchronously, the member key and every held lease that
// is due: every renewEvery after the last renewal sent, and at every tick
// after one failed for any other reason than the lease being gone (the
// bucket has no leader, say), until the lease's own deadline revokes it.
func (g *Group) renew(ctx context.Context) {
	now := time.Now()
	if !g.memberRev && !g.closing && !now.Before(g.memberNext) {
		g.memberRev = true
		go func() {
			sent := time.Now()
			err := g.putMember(ctx)
			g.post(func() {
				g.memberRev = false
				if errors.Is(err, store.ErrPermissionDenied) && g.fatal == nil {
					// No outage to wait out: the server answered, and
					// the key expires whatever this member asks again.
					g.fatal = err
					g.log.Error("group membership not renewed: the server denies these credentials the member key; leaving the group", "err", err)
					return
				}
				if err != nil {
					g.memberNext = time.Now().Add(retryEvery)
					if g.memberFail.IsZero() {
						g.memberFail = sent
						g.log.Warn("renew membership; retrying", "err", err)
					}
					return
				}
				g.memberNext = sent.Add(g.renewEvery())
				if !g.memberFail.IsZero() {
					g.log.Info("membership renewed again", "after", time.Since(g.memberFail).Round(time.Millisecond))
					g.memberFail = time.Time{}
				}
			})
		}()
	}
	for _, l := range g.mine {
		if l.renewing || l.isStopped() || (l.ctx.Err() != nil && !l.releasing) || now.Before(l.next) {
			continue
		}
		l.renewing = true
		rev, unanswered := l.rev, l.unanswered
		go func() {
			sent := time.Now()
			rctx, cancel := context.WithTimeout(ctx, g.opTimeout())
			// A renewal the server's permissions deny fails with the
			// denial, not at its timeout (then retried until the deadline).
			rctx, release := store.GuardDenied(rctx, g.nc, g.keySubject(leaseKey(l.p)))
			nrev, err := g.kv.Update(rctx, leaseKey(l.p), l.value, rev)
			denied := store.Denial(rctx)
			release()
			cancel()
			stale := errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) ||
				errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(store.ServerError(err), store.ErrConflict)
			// Refused as stale after a renewal that got no answer: that
			// one may have been stored (a loaded cluster answered after
			// the timeout), and the lease is still this instance's, at its
			// revision. Every lease of a member under -race on two loaded
			// cores was revoked as lost that way, at once.
			var stored uint64
			var readErr error
			if err != nil && denied != nil {
				err = denied
			}
			if stale && unanswered {
				stored, readErr = g.ownStored(ctx, leaseKey(l.p), l.value, rev)
			}
			g.post(func() {
				l.renewing = false
				switch {
				case err == nil:
					l.rev, l.unanswered, l.unansweredSince = nrev, false, time.Time{}
					l.next = sent.Add(g.renewEvery())
					l.extend(sent.Add(g.ttl - g.margin()))
				case errors.Is(err, store.ErrPermissionDenied):
					// An answer: nothing asked again keeps the key, so the
					// partition stops now rather than at its deadline.
					if l.ctx.Err() == nil {
						g.log.Error("partition lease not renewed: the server denies these credentials its key; its session stops", "partition", l.p, "err", err)
					}
					l.revoke(fmt.Errorf("%w: %w", ErrLeaseLost, err))
				case stored > 0:
					// One of the renewals that got no answer was stored, and
					// none was sent before the first of them: the server
					// keeps the key a TTL from then at least, as for an
					// answered renewal sent then. Renewed from that revision
					// at the next tick.
					l.extend(l.unansweredSince.Add(g.ttl - g.margin()))
					l.rev, l.unanswered, l.unansweredSince = stored, false, time.Time{}
					l.next = time.Now()
					g.log.Debug("renew partition lease: a renewal that got no answer was stored", "partition", l.p, "revision", stored)
				case stale && readErr == nil:
					// Expired, perhaps taken: it is not ours any more.
					l.revoke(fmt.Errorf("%w: %v", ErrLeaseLost, err))
				default:
					// No answer (or the look at the key got none): sent
					// again at the next tick, until the deadline.
					if !l.unanswered && err != nil && !stale {
						l.unanswered, l.unansweredSince = true, sent
					}
					l.next = time.Now().Add(retryEvery)
					g.log.Debug("renew partition lease; retrying", "partition", l.p, "err", err, "read", readErr)
				}
			})
		}()
	}
}

// logKept says that the released leases of partitions ps were left to
// expire.
func (g *Group) logKept(ps []int) {
	slices.Sort(ps)
	g.log.Warn("partition leases not released: their server is gone; they expire after their TTL", "partitions", ps, "ttl", g.ttl)
}

// sweep forgets the leases whose partitions have stopped: a released one
// is deleted (at the revision it owns, so the next owner starts at once); a
// lost one is left to expire or to its new holder.
//
// With the bucket's server gone (serverGone) a released lease is not
// deleted, nor is a renewal under way waited for (a delete needs the
// revision it gets): the delete and the renewal would each wait out
// their timeout unanswered, which a stop against a kill -9'd server
// did; the lease expires after the TTL.
func (g *Group) sweep(ctx context.Context) {
	var lost, kept []int
	gone := g.serverGone()
	for p, l := range g.mine {
		if !l.isStopped() || l.renewing && !gone {
			continue
		}
		l.timer.Stop()
		delete(g.mine, p)
		if errors.Is(context.Cause(l.ctx), ErrReleased) && l.valid() {
			if gone {
				kept = append(kept, p)
				continue
			}
			g.deleting.Add(1)
			go func() {
				defer g.deleting.Done()
				dctx, cancel := context.WithTimeout(ctx, g.opTimeout())
				dctx, release := store.GuardDenied(dctx, g.nc, g.keySubject(leaseKey(p)))
				err := g.kv.Delete(dctx, leaseKey(p), jetstream.LastRevision(l.rev))
				if d := store.Denial(dctx); err != nil && d != nil {
					err = d // a denied delete says so at once
				}
				release()
				cancel()
				if err != nil {
					g.kept.Store(true)
					g.log.Warn("release partition lease: not deleted; it expires", "partition", p, "err", err)
					return
				}
				g.log.Debug("partition released", "partition", p)
			}()
		} else {
			lost = append(lost, p)
			g.log.Debug("partition lease lost", "partition", p, "cause", context.Cause(l.ctx))
		}
	}
	if len(lost) > 0 {
		slices.Sort(lost)
		g.log.Warn("partition leases lost; their sessions stopped without writing", "partitions", lost)
	}
	if len(kept) > 0 {
		g.kept.Store(true)
		if g.closing {
			g.keptLeases = append(g.keptLeases, kept...) // one line as Run returns
		} else {
			g.logKept(kept)
		}
	}
	g.setOwned()
}
