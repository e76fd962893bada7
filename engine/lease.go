package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

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
// then hands the results to the loop at once.
func (g *Group) acquire(ctx context.Context, ps []int) {
	val, _ := json.Marshal(leaseValue{Group: g.cfg.Name, Instance: g.cfg.Instance, Since: time.Now().UTC()})
	revs := make([]uint64, len(ps))
	errs := make([]error, len(ps))
	sent := time.Now()
	actx, cancel := context.WithTimeout(ctx, g.opTimeout())
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			revs[i], errs[i] = g.kv.Create(actx, leaseKey(p), val)
		}()
	}
	wg.Wait()
	cancel()
	g.post(func() {
		for i, p := range ps {
			g.acquiring[p] = false
			if err := errs[i]; err != nil {
				g.tryAt[p] = time.Now().Add(retryEvery)
				if !errors.Is(err, jetstream.ErrKeyExists) {
					g.log.Debug("acquire partition lease", "partition", p, "err", err)
				}
				continue
			}
			g.grant(p, revs[i], val, sent)
		}
		g.setOwned()
	})
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
		rev := l.rev
		go func() {
			sent := time.Now()
			rctx, cancel := context.WithTimeout(ctx, g.opTimeout())
			nrev, err := g.kv.Update(rctx, leaseKey(l.p), l.value, rev)
			cancel()
			g.post(func() {
				l.renewing = false
				switch {
				case err == nil:
					l.rev = nrev
					l.next = sent.Add(g.renewEvery())
					l.mu.Lock()
					l.deadline = sent.Add(g.ttl - g.margin())
					l.mu.Unlock()
					l.timer.Reset(time.Until(l.deadline))
				case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists),
					errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(store.ServerError(err), store.ErrConflict):
					// Expired, perhaps taken: it is not ours any more.
					l.revoke(fmt.Errorf("%w: %v", ErrLeaseLost, err))
				default:
					l.next = time.Now().Add(retryEvery)
					g.log.Debug("renew partition lease; retrying", "partition", l.p, "err", err)
				}
			})
		}()
	}
}

// sweep forgets the leases whose partitions have stopped: a released one
// is deleted (at the revision it owns, so the next owner starts at once); a
// lost one is left to expire or to its new holder.
func (g *Group) sweep(ctx context.Context) {
	var lost []int
	for p, l := range g.mine {
		if !l.isStopped() || l.renewing {
			continue
		}
		l.timer.Stop()
		delete(g.mine, p)
		if errors.Is(context.Cause(l.ctx), ErrReleased) && l.valid() {
			g.deleting.Add(1)
			go func() {
				defer g.deleting.Done()
				dctx, cancel := context.WithTimeout(ctx, g.opTimeout())
				err := g.kv.Delete(dctx, leaseKey(p), jetstream.LastRevision(l.rev))
				cancel()
				if err != nil {
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
	g.setOwned()
}
