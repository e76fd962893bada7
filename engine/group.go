package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
)

// Group defaults.
const (
	DefaultGroupName = "reconcilers"
	DefaultLeaseTTL  = 5 * time.Second
	// LeaseBucketSuffix is appended to the stream name to name the lease
	// bucket: MESH → MESH_LEASES.
	LeaseBucketSuffix = "_LEASES"
	// minLeaseTTL bounds the TTL from below: renewals run every TTL/4,
	// and the server expires keys with a granularity of ~0.2 s.
	minLeaseTTL = time.Second
)

// Why a partition stops being this instance's: the cause of a
// [Grant.Revoked] context.
var (
	// ErrReleased: the partition is handed over to another member of the
	// group. Its session finishes the event in hand, waits for its
	// effects' acks and writes its snapshot, then stops; only then is the
	// lease deleted for the next owner.
	ErrReleased = errors.New("engine: partition released to another instance")
	// ErrLeaseLost: the partition's lease was not renewed in time or was
	// taken by another instance. Its session stops at once and writes
	// nothing more, not even a snapshot.
	ErrLeaseLost = errors.New("engine: partition lease lost")
)

// Grant hands one partition to a [Reconciler] (see
// [ReconcilerConfig.Grants]) until it is revoked.
type Grant struct {
	// Partition is the partition granted, 0..N-1.
	Partition int
	// Revoked is done once the partition is no longer this instance's to
	// fold; context.Cause says how: [ErrReleased] (hand over gracefully)
	// or an error wrapping [ErrLeaseLost] (stop at once). Nil: never.
	Revoked context.Context
	// Valid reports whether the partition's lease still holds by this
	// process's clock: false once its local deadline (the last renewal
	// sent, plus the TTL, minus a margin) has passed, even before the
	// revocation is delivered, as after a long pause of the process. The
	// reconciler checks it before every publish and snapshot write. Nil:
	// always valid.
	Valid func() bool
	// Stopped, when set, is called once, when the partition's session has
	// ended and nothing more is written for it.
	Stopped func()
}

// GroupConfig configures [JoinGroup]. Zero fields take their defaults.
type GroupConfig struct {
	// Stream is the stream's effective configuration, as [EnsureStream]
	// returns it: its name names the lease bucket, its partition count is
	// what the group shares, and a new bucket gets its replica count.
	Stream store.StreamConfig
	// Name is the group's name; default "reconcilers". Letters, digits,
	// '-' and '_'. The members of one group share the partitions.
	Name string
	// Instance names this member, unique within the group; default
	// "<hostname>-<pid>". Letters, digits, '-' and '_' (others are
	// replaced by '-').
	Instance string
	// TTL is how long a lease or a membership lives without renewal: the
	// longest a dead or hung instance keeps its partitions. Default 5 s,
	// at least 1 s. It is the lease bucket's TTL, set when the bucket is
	// created; an existing bucket's TTL wins over this one.
	TTL    time.Duration
	Logger *slog.Logger
}

var groupTokenRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Group is one instance's membership of a group of reconcilers sharing a
// stream's partitions, on a JetStream KV bucket (<stream>_LEASES, file
// storage, the stream's replicas, history 1, TTL = the lease TTL, with
// limit markers so that an expiry is seen by every watcher):
//
//	member.<group>.<instance>  one per live instance, renewed every TTL/4
//	lease.<partition>          the partition's holder: created only if
//	                           absent (Create), renewed only at the
//	                           revision it holds (Update, compare and
//	                           swap), deleted at that revision on release
//
// Every member watches the bucket and computes the same assignment from
// the live members of its group, sorted by name: partition p belongs to
// member p·m/N (contiguous, balanced blocks, as pcgroups assigns static
// members). It acquires the free leases of its share and hands each to
// its reconciler as a [Grant]; it releases (gracefully) the partitions
// that moved to another member, and revokes at once (as lost) any lease
// whose renewal fails at the server or whose local deadline passes. A
// dead or hung instance's leases and membership expire after the TTL,
// and the others take its partitions over. Leases are per stream, not
// per group: two groups on one stream never fold a partition at the same
// time.
type Group struct {
	cfg    GroupConfig
	kv     jetstream.KeyValue
	ttl    time.Duration
	log    *slog.Logger
	n      int
	grants chan Grant
	notify chan struct{} // a lease stopped or expired: look again
	events chan func()   // results of asynchronous calls, run by the loop
	quit   chan struct{} // closed when Run returns
	member []byte        // the member key's value

	// Owned by the loop goroutine.
	members   map[string]bool // live members of this group
	view      []leaseView     // what the watch says of each lease
	mine      map[int]*lease
	acquiring map[int]bool
	memberRev bool // a member renewal is in flight
	closing   bool
	loading   bool // applying a watch's initial values: nothing to log
	deleting  sync.WaitGroup

	mu       sync.Mutex // guards owned, logged, logTimer
	owned    []int
	logged   []int       // the partitions last logged as owned
	logTimer *time.Timer // a pending log of owned partitions
}

// JoinGroup opens (or creates) the lease bucket of cfg.Stream's stream
// and returns this instance's membership. Nothing is acquired until
// [Group.Run]; pass [Group.Grants] to the reconciler
// ([ReconcilerConfig.Grants]).
//
// Errors: a bad group or instance name; the bucket's lookup or creation
// failing (a server without per-key TTL support, older than 2.11,
// fails with jetstream.ErrLimitMarkerTTLNotSupported).
func JoinGroup(ctx context.Context, js jetstream.JetStream, cfg GroupConfig) (*Group, error) {
	cfg.Stream = cfg.Stream.WithDefaults()
	if cfg.Name == "" {
		cfg.Name = DefaultGroupName
	}
	if !groupTokenRE.MatchString(cfg.Name) {
		return nil, fmt.Errorf("group name %q: letters, digits, - and _ only, at most 64", cfg.Name)
	}
	if cfg.Instance == "" {
		cfg.Instance = DefaultInstance()
	}
	if !groupTokenRE.MatchString(cfg.Instance) {
		return nil, fmt.Errorf("instance %q: letters, digits, - and _ only, at most 64", cfg.Instance)
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultLeaseTTL
	}
	if cfg.TTL < minLeaseTTL {
		return nil, fmt.Errorf("lease TTL %s: at least %s", cfg.TTL, minLeaseTTL)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	kv, ttl, err := openLeaseBucket(ctx, js, cfg.Stream, cfg.TTL, cfg.Logger)
	if err != nil {
		return nil, err
	}
	n := cfg.Stream.Partitions
	return &Group{cfg: cfg, kv: kv, ttl: ttl, n: n,
		log:    cfg.Logger.With("group", cfg.Name, "instance", cfg.Instance),
		grants: make(chan Grant, n), notify: make(chan struct{}, 1), events: make(chan func(), 4*n+8),
		quit:    make(chan struct{}),
		members: map[string]bool{}, view: make([]leaseView, n), mine: map[int]*lease{}, acquiring: map[int]bool{}}, nil
}

// openLeaseBucket opens the lease bucket of streamCfg's stream, creating
// it with ttl when missing, and returns it with its TTL (an existing
// bucket's wins over ttl).
func openLeaseBucket(ctx context.Context, js jetstream.JetStream, streamCfg store.StreamConfig, ttl time.Duration, log *slog.Logger) (jetstream.KeyValue, time.Duration, error) {
	bucket := streamCfg.Name + LeaseBucketSuffix
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:         bucket,
			Description:    "meshfold reconcilers of stream " + streamCfg.Name + ": member.<group>.<instance>, lease.<partition>, stream (an ungrouped reconciler)",
			History:        1,
			TTL:            ttl,
			LimitMarkerTTL: ttl,
			Storage:        jetstream.FileStorage,
			Replicas:       streamCfg.Replicas,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, bucket) // created concurrently
		}
	}
	if err != nil {
		return nil, 0, fmt.Errorf("lease bucket %s: %w", bucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("lease bucket %s: %w", bucket, err)
	}
	got := st.TTL()
	switch {
	case got <= 0:
		return nil, 0, fmt.Errorf("lease bucket %s has no TTL: a dead instance's leases would never expire", bucket)
	case st.LimitMarkerTTL() <= 0:
		return nil, 0, fmt.Errorf("lease bucket %s has no limit markers: expiries would go unseen", bucket)
	case got != ttl:
		log.Warn("lease bucket's TTL differs from --lease-ttl; the bucket's wins", "bucket", bucket, "ttl", got, "asked", ttl)
	}
	return kv, got, nil
}

// DefaultInstance is the default instance name: "<hostname>-<pid>",
// with characters other than letters, digits, '-' and '_' replaced by
// '-'.
func DefaultInstance() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "meshfold"
	}
	host = strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return '-'
	}, host)
	if len(host) > 50 {
		host = host[:50]
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// Grants returns the channel of this instance's grants, for
// [ReconcilerConfig.Grants]. A partition is granted again only after the
// Stopped of its previous grant was called.
func (g *Group) Grants() <-chan Grant { return g.grants }

// Instance returns this member's name.
func (g *Group) Instance() string { return g.cfg.Instance }

// TTL returns the lease TTL in force (the bucket's).
func (g *Group) TTL() time.Duration { return g.ttl }

// Owned returns the partitions this instance holds a lease of and has
// not been revoked, sorted.
func (g *Group) Owned() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.owned)
}

func (g *Group) memberKey() string        { return "member." + g.cfg.Name + "." + g.cfg.Instance }
func leaseKey(p int) string               { return "lease." + strconv.Itoa(p) }
func (g *Group) opTimeout() time.Duration { return g.ttl / 4 }

// margin is how much earlier than the server the local clock gives a
// lease up: for clock rate differences and scheduling.
func (g *Group) margin() time.Duration { return g.ttl / 10 }

// Run keeps the membership and the leases until ctx is done: it joins
// (puts its member key), watches the bucket, acquires and renews the
// leases of its share, grants them, and releases or revokes them as the
// membership changes. When ctx is done it revokes every grant as
// released, waits (up to 30 s plus the TTL) for each partition to stop,
// deletes its leases and its member key, and returns nil: the other
// members take the partitions over at once instead of after the TTL.
// Run the reconciler with the same ctx.
//
// Errors: the first member put or watch failing (the bucket is
// unreachable); later failures are retried, and leases that cannot be
// renewed are revoked as lost.
func (g *Group) Run(ctx context.Context) error {
	defer close(g.quit)
	work := context.WithoutCancel(ctx)
	g.member, _ = json.Marshal(leaseValue{Group: g.cfg.Name, Instance: g.cfg.Instance, Since: time.Now().UTC()})
	if err := g.putMember(ctx); err != nil {
		return err
	}
	if err := g.checkUngrouped(ctx); err != nil {
		dctx, cancel := context.WithTimeout(work, g.opTimeout())
		_ = g.kv.Delete(dctx, g.memberKey())
		cancel()
		return err
	}
	w, err := g.watch(ctx)
	if err != nil {
		return err
	}
	defer func() { w.Stop() }()
	g.log.Info("joined the reconciler group", "ttl", g.ttl, "members", g.memberList())
	g.rebalance(work)

	tick := time.NewTicker(g.ttl / 4)
	defer tick.Stop()
	var shutdown <-chan time.Time
	done := ctx.Done()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				// The watch ended (it should not): watch again, from the
				// bucket's current values.
				g.log.Warn("lease watch ended; watching again")
				if w, err = g.watch(work); err != nil {
					g.log.Warn("lease watch", "err", err)
					w = closedWatcher{}
				}
				continue
			}
			if e != nil {
				g.apply(e)
			}
		case f := <-g.events:
			f()
			// Take every result that is in: one look at the whole.
		drain:
			for {
				select {
				case f := <-g.events:
					f()
				default:
					break drain
				}
			}
		case <-g.notify:
		case <-tick.C:
			g.renew(work)
			if _, ok := w.(closedWatcher); ok {
				if nw, err := g.watch(work); err == nil {
					w = nw
				}
			}
		case <-done:
			done = nil
			g.closing = true
			for _, l := range g.mine {
				l.releasing = true
				l.revoke(ErrReleased)
			}
			g.drainGrants()
			shutdown = time.After(30*time.Second + g.ttl)
		case <-shutdown:
			g.log.Warn("partitions did not stop in time; their leases will expire", "partitions", slices.Sorted(maps.Keys(g.mine)))
			g.mine = map[int]*lease{}
		}
		g.sweep(work)
		if g.closing && len(g.mine) == 0 {
			g.deleting.Wait()
			dctx, cancel := context.WithTimeout(work, g.opTimeout())
			err := g.kv.Delete(dctx, g.memberKey())
			cancel()
			if err != nil {
				g.log.Warn("leaving the group: member key not deleted; it expires", "err", err)
			}
			g.log.Info("left the reconciler group")
			return nil
		}
		if !g.closing {
			g.rebalance(work)
		}
	}
}

// closedWatcher stands in for a watch that could not be restarted.
type closedWatcher struct{}

func (closedWatcher) Updates() <-chan jetstream.KeyValueEntry { return nil }
func (closedWatcher) Stop() error                             { return nil }

// watch watches the whole bucket and applies its initial values.
func (g *Group) watch(ctx context.Context) (jetstream.KeyWatcher, error) {
	w, err := g.kv.WatchAll(context.WithoutCancel(ctx))
	if err != nil {
		return nil, fmt.Errorf("watch lease bucket: %w", err)
	}
	g.members = map[string]bool{}
	g.view = make([]leaseView, g.n)
	g.loading = true
	defer func() { g.loading = false }()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("watch lease bucket: closed before its initial values")
			}
			if e == nil {
				return w, nil
			}
			g.apply(e)
		case <-ctx.Done():
			w.Stop()
			return nil, ctx.Err()
		}
	}
}

// apply records one watched entry.
func (g *Group) apply(e jetstream.KeyValueEntry) {
	live := e.Operation() == jetstream.KeyValuePut
	key := e.Key()
	if rest, ok := strings.CutPrefix(key, "member."+g.cfg.Name+"."); ok {
		if live != g.members[rest] {
			if live {
				g.members[rest] = true
			} else {
				delete(g.members, rest)
			}
			if !g.loading {
				g.log.Info("group membership changed", "members", g.memberList())
			}
		}
		return
	}
	if rest, ok := strings.CutPrefix(key, "lease."); ok {
		p, err := strconv.Atoi(rest)
		if err != nil || p < 0 || p >= g.n {
			return
		}
		v := leaseView{present: live}
		if live {
			var lv leaseValue
			_ = json.Unmarshal(e.Value(), &lv)
			v.holder = lv.Instance
		}
		g.view[p] = v
	}
}

func (g *Group) memberList() []string { return slices.Sorted(maps.Keys(g.members)) }

// rebalance releases what is no longer this instance's share and
// acquires the free leases that are (see [assignment.moves]).
func (g *Group) rebalance(ctx context.Context) {
	members := g.memberList()
	seen := make([]leaseSeen, g.n)
	for p := range g.n {
		l := g.mine[p]
		seen[p] = leaseSeen{mine: l != nil, revoked: l != nil && l.ctx.Err() != nil,
			acquiring: g.acquiring[p], present: g.view[p].present}
	}
	released, free := assign(members, g.n).moves(g.cfg.Instance, seen)
	for _, p := range released {
		l := g.mine[p]
		l.releasing = true
		l.revoke(ErrReleased)
	}
	for _, p := range free {
		g.acquiring[p] = true
	}
	if len(free) > 0 {
		go g.acquire(ctx, free)
	}
	if len(released) > 0 {
		g.log.Info("handing partitions over to other members", "partitions", released, "members", members)
		g.setOwned()
	}
}

// post hands f to the loop, unless Run has returned.
func (g *Group) post(f func()) {
	select {
	case g.events <- f:
	case <-g.quit:
	}
}

// poke wakes the loop.
func (g *Group) poke() {
	select {
	case g.notify <- struct{}{}:
	default:
	}
}

// drainGrants takes back the grants the reconciler has not received
// (it stopped reading): their partitions never started.
func (g *Group) drainGrants() {
	for {
		select {
		case gr := <-g.grants:
			gr.Stopped()
		default:
			return
		}
	}
}

// setOwned publishes the partitions owned and not revoked. A change is
// logged once things settle (100 ms later), so that a takeover of eight
// partitions is one line.
func (g *Group) setOwned() {
	owned := []int{}
	for p, l := range g.mine {
		if l.ctx.Err() == nil {
			owned = append(owned, p)
		}
	}
	slices.Sort(owned)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.owned = owned
	if g.logTimer == nil && !slices.Equal(owned, g.logged) {
		g.logTimer = time.AfterFunc(100*time.Millisecond, func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.logTimer = nil
			if !slices.Equal(g.owned, g.logged) {
				g.logged = g.owned
				g.log.Info("partitions owned", "count", len(g.owned), "partitions", g.owned)
			}
		})
	}
}

// putMember puts this instance's member key.
func (g *Group) putMember(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, g.opTimeout())
	defer cancel()
	if _, err := g.kv.Put(pctx, g.memberKey(), g.member); err != nil {
		return fmt.Errorf("group membership: %w", err)
	}
	return nil
}
