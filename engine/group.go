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
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
)

// Group defaults.
const (
	DefaultGroupName = "reconcilers"
	// DefaultLeaseTTL outlives an election of the lease bucket's leader
	// after a crash (4.5–9.8 s measured, see docs/architecture.md, "Leases
	// and elections"): with it a lease survives a bucket without a leader
	// for ~12 s.
	DefaultLeaseTTL = 15 * time.Second
	// LeaseBucketSuffix is appended to the stream name to name the lease
	// bucket: MESH → MESH_LEASES.
	LeaseBucketSuffix = "_LEASES"
	// minLeaseTTL bounds the TTL from below: renewals run every TTL/6 (at
	// most every second), and the server expires keys with a granularity
	// of ~0.2 s.
	minLeaseTTL = time.Second
	// retryEvery is the group's tick: a renewal that failed (the bucket
	// electing a leader) is sent again at the next tick, until the
	// lease's own deadline; missing leases of the member's share are
	// looked for at every tick.
	retryEvery = 250 * time.Millisecond
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
	// longest a dead or hung instance keeps its partitions, and what a
	// bucket without a leader must elect one within. Default 15 s, at
	// least 1 s. It is the lease bucket's TTL, set when the bucket is
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
//	member.<group>.<instance>  one per live instance, renewed every
//	                           TTL/6 (at most every second)
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
// a renewal finds gone or taken, or whose local deadline passes; a
// renewal that fails for another reason (no leader) is retried every
// 250 ms until that deadline. The watch is not trusted alone (it missed
// entries across server crashes, issue 13): every TTL/2 it is replaced
// by a fresh one whose initial values rebuild the view; a lease of the
// share that the view says is missing, stale (not renewed for 1.25 TTL)
// or this instance's while it holds none is looked for at every tick;
// and this instance always counts itself a member. A
// dead or hung instance's leases and membership expire after the TTL,
// and the others take its partitions over. Leases are per stream, not
// per group: two groups on one stream never fold a partition at the same
// time.
type Group struct {
	cfg    GroupConfig
	kv     jetstream.KeyValue
	nc     *nats.Conn // the bucket's connection: serverGone
	ttl    time.Duration
	log    *slog.Logger
	n      int
	grants chan Grant
	notify chan struct{} // a lease stopped or expired: look again
	events chan func()   // results of asynchronous calls, run by the loop
	quit   chan struct{} // closed when Run returns
	member []byte        // the member key's value

	// Owned by the loop goroutine.
	w         jetstream.KeyWatcher
	members   map[string]time.Time // members of this group: when each last renewed (the server's time)
	view      []leaseView          // what the watch says of each lease
	mine      map[int]*lease
	acquiring map[int]bool
	tryAt     []time.Time             // no create of the lease before then (one just failed)
	pending   map[int][]createAttempt // creates of a lease that got no answer since its last answered one
	// failing: the partitions of this member's share whose lease it
	// failed to create, since when and why (warnUnacquired).
	failing         map[int]*unacquired
	acquireWarnNext time.Time // no warning of failing before then
	memberRev       bool      // a member renewal is in flight
	memberNext      time.Time // the member key's next renewal
	memberFail      time.Time // when member renewals started failing; zero while they succeed
	rewatching      bool      // a fresh watch is being read
	watchNext       time.Time // when the watch is next replaced by a fresh one
	closing         bool
	// fatal ends Run with it (closing as when ctx ends): the server
	// denied the member key's renewal.
	fatal    error
	loading  bool // applying a watch's initial values: nothing to log
	deleting sync.WaitGroup
	// kept: a lease or the member key was left to expire, not deleted
	// (Released). Set by the loop and its deletions.
	kept       atomic.Bool
	keptLeases []int // the released leases left to expire while closing

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
	var kv jetstream.KeyValue
	var ttl time.Duration
	// A freshly formed cluster answers "no response from stream" until
	// the bucket's leader is elected: retried, as NewReconciler does.
	err := retryTransientEach(ctx, startRetryFor, func(ctx context.Context) (err error) {
		kv, ttl, err = openLeaseBucket(ctx, js, cfg.Stream, cfg.TTL, cfg.Logger)
		return err
	})
	if err != nil {
		return nil, err
	}
	n := cfg.Stream.Partitions
	return &Group{cfg: cfg, kv: kv, nc: js.Conn(), ttl: ttl, n: n,
		log:    cfg.Logger.With("group", cfg.Name, "instance", cfg.Instance),
		grants: make(chan Grant, n), notify: make(chan struct{}, 1), events: make(chan func(), 4*n+8),
		quit:    make(chan struct{}),
		members: map[string]time.Time{}, view: make([]leaseView, n), mine: map[int]*lease{}, acquiring: map[int]bool{},
		tryAt: make([]time.Time, n), pending: map[int][]createAttempt{}, failing: map[int]*unacquired{}}, nil
}

// openLeaseBucket opens the lease bucket of streamCfg's stream, creating
// it with ttl when missing, and returns it with its TTL (an existing
// bucket's wins over ttl). The bucket is a store.LeaseBucket of js's
// connection: a claim, a renewal or a release of a store.Lease in it
// that the server's permissions deny ends at once with the denial.
func openLeaseBucket(ctx context.Context, js jetstream.JetStream, streamCfg store.StreamConfig, ttl time.Duration, log *slog.Logger) (jetstream.KeyValue, time.Duration, error) {
	bucket := streamCfg.Name + LeaseBucketSuffix
	// The bucket and its stream's configuration (its TTL and limit
	// markers) are asked for at once: a status request after the lookup
	// was a round trip of every start (issue 27). A bucket created here
	// is asked for its status after its creation. The lookup is asked
	// once, and waited for only a moment past the open's end
	// (lookupGrace): a stream's info asked while the group of a stream
	// just created elects its first leader is answered by no server
	// (nats-server 2.15: only the stream's leader answers, and its
	// members say "no leader" only once the group has had none for
	// longer than its quorum-loss interval), and waited for under the
	// attempt's whole 30 s it held a start that had opened its bucket in
	// 250 ms for all of them, whose status ask was then left 1 ms ("did
	// not answer within 1ms", CI, TestAgentLivenessAcrossAQuorumLoss).
	var (
		cfgOf *jetstream.StreamConfig
		wg    sync.WaitGroup
	)
	began := time.Now()
	lctx, stopLookup := context.WithCancel(ctx)
	defer stopLookup()
	looked := make(chan struct{})
	wg.Go(func() {
		defer close(looked)
		if st, err := js.Stream(lctx, "KV_"+bucket); err == nil {
			cfgOf = &st.CachedInfo().Config
		}
	})
	// Opened and created as the other buckets are (store.OpenKV): a
	// creation's lookup answered "not found" right after "already in
	// use", and the status of a bucket just created answered "not found"
	// (10059, store.KVStatus), are asked again; asked once, either ended
	// a start under load ~50.
	kv, err := store.OpenKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:         bucket,
		Description:    "meshfold reconcilers of stream " + streamCfg.Name + ": member.<group>.<instance>, lease.<partition>, stream (an ungrouped reconciler)",
		History:        1,
		TTL:            ttl,
		LimitMarkerTTL: ttl,
		Storage:        jetstream.FileStorage,
		Replicas:       streamCfg.Replicas,
	})
	grace := time.NewTimer(min(time.Since(began), lookupGrace))
	select {
	case <-looked:
	case <-grace.C:
	}
	grace.Stop()
	stopLookup()
	wg.Wait()
	if err == nil && cfgOf == nil {
		var st jetstream.KeyValueStatus
		if st, err = store.KVStatus(ctx, js, kv); err == nil {
			cfgOf = &jetstream.StreamConfig{MaxAge: st.TTL(), SubjectDeleteMarkerTTL: st.LimitMarkerTTL()}
		} else {
			err = waitedSince(err, began)
		}
	}
	if err != nil {
		return nil, 0, fmt.Errorf("lease bucket %s: %w", bucket, err)
	}
	got := cfgOf.MaxAge // the bucket's TTL (KeyValueStatus.TTL)
	switch {
	case got <= 0:
		return nil, 0, fmt.Errorf("lease bucket %s has no TTL: a dead instance's leases would never expire", bucket)
	case cfgOf.SubjectDeleteMarkerTTL <= 0: // KeyValueStatus.LimitMarkerTTL
		return nil, 0, fmt.Errorf("lease bucket %s has no limit markers: expiries would go unseen", bucket)
	case got != ttl:
		log.Warn("lease bucket's TTL differs from --lease-ttl; the bucket's wins", "bucket", bucket, "ttl", got, "asked", ttl)
	}
	return store.LeaseBucket(kv, js.Conn()), got, nil
}

// lookupGrace bounds how long openLeaseBucket waits, once its open is
// done, for the lookup of the bucket's configuration sent beside it: as
// long as the open took, at most this. A lookup that came first saves
// the status ask's round trip; one still out is cut, and the status is
// asked for as every ask of a bucket is (store.KVStatus: again while
// unanswered).
const lookupGrace = time.Second

// waitedSince returns err, the error of a start's ask made after others
// that began at began, saying the whole wait when it is a
// *store.NoLeaderError: an ask left little time by the asks before it
// said it "did not answer within 1ms" when the start had waited 30 s.
func waitedSince(err error, began time.Time) error {
	nl, ok := err.(*store.NoLeaderError) // as store.KVStatus returns it
	if !ok {
		return err
	}
	whole := *nl
	whole.Waited = time.Since(began)
	return &whole
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

func (g *Group) memberKey() string { return "member." + g.cfg.Name + "." + g.cfg.Instance }
func leaseKey(p int) string        { return "lease." + strconv.Itoa(p) }

// opTimeout bounds each call on the bucket: a call that fails for want
// of a leader is retried at a later tick.
func (g *Group) opTimeout() time.Duration { return min(g.ttl/4, 2*time.Second) }

// renewEvery is the renewal cadence of the member key and of every lease:
// a lease survives a bucket without a leader for its TTL minus the margin
// minus one cadence (see docs/architecture.md, "Leases and elections").
func (g *Group) renewEvery() time.Duration { return min(g.ttl/6, time.Second) }

// resyncEvery is how often the watch is replaced by a fresh one whose
// initial values rebuild the view.
func (g *Group) resyncEvery() time.Duration { return g.ttl / 2 }

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
// With the bucket's server gone and no other to answer (serverGone) it
// deletes nothing and returns at once: the keys expire after the TTL
// ([Group.Released] says which).
// Run the reconciler with the same ctx.
//
// Errors: the first member put or watch failing (the bucket is
// unreachable, or the put denied: a *store.DeniedError); later failures
// are retried, and leases that cannot be renewed are revoked as lost. A
// renewal the server's permissions deny is no failure to retry: a
// partition lease's revokes that partition at once as lost (wrapping
// [ErrLeaseLost] and the *store.DeniedError), and the member key's ends
// Run, as a stop does (the partitions handed over, the keys deleted if
// the server lets it), with an error wrapping the *store.DeniedError
// (matching store.ErrPermissionDenied). See docs/architecture.md, "A
// denied renewal ends the lease".
func (g *Group) Run(ctx context.Context) error {
	defer close(g.quit)
	defer g.flushOwnedLog()
	work := context.WithoutCancel(ctx)
	g.member, _ = json.Marshal(leaseValue{Group: g.cfg.Name, Instance: g.cfg.Instance, Since: time.Now().UTC()})
	// Asked again within the start's bound while the bucket does not
	// answer (a cluster without a quorum): the first put's one ask ended
	// a member started during an outage after 2-6.5 s with "group
	// membership: nats: no response from stream", where the stream and
	// the buckets before it had waited (a fresh user's finding M4). A
	// denial ends it at once.
	if err := retryTransient(ctx, g.putMember); err != nil {
		return err
	}
	// The claim on the stream key may wait out a dead holder's (up to
	// the TTL): the member key is kept alive meanwhile, or it would
	// expire and an ungrouped reconciler could start beside the group.
	stopKeeping := g.keepMember(ctx)
	err := g.checkUngrouped(ctx)
	stopKeeping()
	if err != nil {
		dctx, cancel := context.WithTimeout(work, g.opTimeout())
		_ = g.kv.Delete(dctx, g.memberKey())
		cancel()
		return err
	}
	g.memberNext = time.Now().Add(g.renewEvery())
	var (
		w       jetstream.KeyWatcher
		entries []jetstream.KeyValueEntry
	)
	// Each attempt is bounded by the watch's own 4 × opTimeout (a
	// consumer's creation), not retryTransient's per-attempt bound.
	err = retryTransient(ctx, func(context.Context) (err error) {
		w, entries, err = g.watch(ctx)
		return err
	})
	if err != nil {
		return err
	}
	g.install(w, entries)
	defer func() { stopWatch(g.w) }()
	g.log.Info("joined the reconciler group", "ttl", g.ttl, "members", g.memberList())
	g.rebalance(work)

	tick := time.NewTicker(retryEvery)
	defer tick.Stop()
	var shutdown <-chan time.Time
	done, stopping := ctx.Done(), false
	for {
		select {
		case e, ok := <-g.w.Updates():
			if !ok {
				// The watch ended (it should not): watch again, from the
				// bucket's current values.
				g.log.Warn("lease watch ended; watching again")
				g.w = closedWatcher{}
				g.rewatch(work)
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
			if !time.Now().Before(g.watchNext) {
				g.rewatch(work)
			}
		case <-done:
			done, stopping = nil, true
		case <-shutdown:
			g.log.Warn("partitions did not stop in time; their leases will expire", "partitions", slices.Sorted(maps.Keys(g.mine)))
			g.mine = map[int]*lease{}
		}
		if !g.closing && (stopping || g.fatal != nil) {
			// Stopped, or the membership denied: the partitions are
			// handed over gracefully (their leases still hold by the
			// local clock; a denied member stops before they expire).
			g.closing = true
			for _, l := range g.mine {
				l.releasing = true
				l.revoke(ErrReleased)
			}
			g.drainGrants()
			shutdown = time.After(30*time.Second + g.ttl)
		}
		g.sweep(work)
		if g.closing && len(g.mine) == 0 {
			g.deleting.Wait()
			if len(g.keptLeases) > 0 {
				g.logKept(g.keptLeases)
			}
			if g.serverGone() {
				g.kept.Store(true)
				g.log.Warn("leaving the group: member key not deleted: its server is gone; it expires after its TTL", "ttl", g.ttl)
				g.log.Info("left the reconciler group")
				return g.fatal
			}
			dctx, cancel := context.WithTimeout(work, g.opTimeout())
			dctx, release := store.GuardDenied(dctx, g.nc, g.keySubject(g.memberKey()))
			err := g.kv.Delete(dctx, g.memberKey())
			if d := store.Denial(dctx); err != nil && d != nil {
				err = d // a denied delete says so at once
			}
			release()
			cancel()
			if err != nil {
				g.kept.Store(true)
				g.log.Warn("leaving the group: member key not deleted; it expires", "err", err)
			}
			g.log.Info("left the reconciler group")
			return g.fatal
		}
		if !g.closing {
			g.rebalance(work)
		}
	}
}

// closedWatcher stands in for a watch that ended, until a fresh one is
// installed.
type closedWatcher struct{}

func (closedWatcher) Updates() <-chan jetstream.KeyValueEntry { return nil }
func (closedWatcher) Stop() error                             { return nil }

// watch starts a watch of the whole bucket and returns it with its
// initial values (the newest entry of every key, markers included),
// waiting for them at most a few operation timeouts.
func (g *Group) watch(ctx context.Context) (jetstream.KeyWatcher, []jetstream.KeyValueEntry, error) {
	wctx, cancel := context.WithTimeout(ctx, 4*g.opTimeout())
	defer cancel()
	w, err := g.kv.WatchAll(context.WithoutCancel(ctx))
	if err != nil {
		return nil, nil, fmt.Errorf("watch lease bucket: %w", err)
	}
	var entries []jetstream.KeyValueEntry
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, nil, errors.New("watch lease bucket: closed before its initial values")
			}
			if e == nil {
				return w, entries, nil
			}
			entries = append(entries, e)
		case <-wctx.Done():
			stopWatch(w)
			return nil, nil, fmt.Errorf("watch lease bucket: initial values: %w", wctx.Err())
		}
	}
}

// stopWatch stops w aside and drains what it still delivers: the
// client's delivery blocks on a full channel nobody reads. Stopping
// deletes the watch's consumer, a request nothing here waits for: the
// loop (a resync) and Run's return (a stop) did, and against a server
// that is gone (kill -9) that waited out the client's 5 s timeout.
func stopWatch(w jetstream.KeyWatcher) {
	if _, closed := w.(closedWatcher); w == nil || closed {
		return
	}
	go func() {
		_ = w.Stop()
		for range w.Updates() {
		}
	}()
}

// serverGone reports whether the bucket's server is gone and no other
// can answer: the connection is down and the bucket has one replica
// (the stream's count, which it is made with). Only that server's
// restart would answer a delete, which a stop does not wait for: a
// released lease and the member key are then left to expire after the
// TTL, as a stream lease is (store.Lease.Abandon), and as a stopping
// partition rides out no election (noRideOut). With replicas a delete
// still rides out the reconnect to another server, within its timeout.
func (g *Group) serverGone() bool { return g.cfg.Stream.Replicas <= 1 && !g.nc.IsConnected() }

// Released reports, once [Group.Run] has returned, whether it deleted
// every lease it released and its member key, so that the other members
// took its partitions over at once; false when some were left to expire
// after the TTL (its server gone, or a delete unanswered).
func (g *Group) Released() bool { return !g.kept.Load() }

// rewatch replaces the watch by a fresh one, in the background: its
// initial values then replace the view. It runs every resyncEvery and
// whenever the watch ends, because the view must not depend on a watch
// having delivered every entry: across a crash of the server holding its
// consumer, the watch missed entries (issue 13), and a missed expiry
// left a lease present in the view forever, so nobody created it again.
func (g *Group) rewatch(ctx context.Context) {
	if g.rewatching {
		return
	}
	g.rewatching = true
	go func() {
		w, entries, err := g.watch(ctx)
		if !g.post(func() {
			g.rewatching = false
			if err != nil {
				g.log.Debug("lease watch", "err", err)
				g.watchNext = time.Now().Add(retryEvery)
				return
			}
			old := g.w
			g.install(w, entries)
			stopWatch(old)
		}) && w != nil {
			stopWatch(w)
		}
	}()
}

// install makes w the watch and rebuilds the view from its initial
// values, logging what the previous view had wrong.
func (g *Group) install(w jetstream.KeyWatcher, entries []jetstream.KeyValueEntry) {
	first := g.w == nil
	oldView, oldMembers := g.view, g.memberList()
	g.w = w
	g.members = map[string]time.Time{}
	g.view = make([]leaseView, g.n)
	g.loading = true
	for _, e := range entries {
		g.apply(e)
	}
	g.loading = false
	g.watchNext = time.Now().Add(g.resyncEvery())
	var wrong []int
	for p := range g.n {
		if oldView[p].present != g.view[p].present || oldView[p].holder != g.view[p].holder {
			wrong = append(wrong, p)
		}
	}
	if members := g.memberList(); !first && (len(wrong) > 0 || !slices.Equal(oldMembers, members)) {
		g.log.Warn("lease view resynced from the bucket: the watch had not delivered every change", "leases", wrong, "members", members)
	}
}

// apply records one watched entry.
func (g *Group) apply(e jetstream.KeyValueEntry) {
	live := e.Operation() == jetstream.KeyValuePut
	key := e.Key()
	if rest, ok := strings.CutPrefix(key, "member."+g.cfg.Name+"."); ok {
		_, was := g.members[rest]
		if live {
			g.members[rest] = e.Created()
		} else {
			delete(g.members, rest)
		}
		if live != was && !g.loading {
			g.log.Info("group membership changed", "members", g.memberList())
		}
		return
	}
	if rest, ok := strings.CutPrefix(key, "lease."); ok {
		p, err := strconv.Atoi(rest)
		if err != nil || p < 0 || p >= g.n {
			return
		}
		v := leaseView{present: live, created: e.Created()}
		if live {
			var lv leaseValue
			_ = json.Unmarshal(e.Value(), &lv)
			v.holder = lv.Instance
		}
		g.view[p] = v
	}
}

// memberList returns the live members, sorted: those whose key the view
// holds and that renewed it recently enough for it to exist still, and
// always this instance while it runs (it renews its own key, and a watch
// that missed that put must not make it give its share away).
func (g *Group) memberList() []string {
	var out []string
	for m, renewed := range g.members {
		if !stale(renewed, g.ttl, time.Now()) {
			out = append(out, m)
		}
	}
	if !g.closing && !slices.Contains(out, g.cfg.Instance) {
		out = append(out, g.cfg.Instance)
	}
	slices.Sort(out)
	return out
}

// rebalance releases what is no longer this instance's share and
// acquires the free leases that are (see [assignment.moves]).
func (g *Group) rebalance(ctx context.Context) {
	members := g.memberList()
	now := time.Now()
	seen := make([]leaseSeen, g.n)
	for p := range g.n {
		l := g.mine[p]
		// A lease the view says exists counts only while another instance
		// renews it: one the view says is this instance's, which holds
		// none, or one not renewed for longer than a lease lives, is
		// looked for again (creating it fails harmlessly if it exists).
		seen[p] = leaseSeen{mine: l != nil, revoked: l != nil && l.ctx.Err() != nil,
			acquiring: g.acquiring[p] || now.Before(g.tryAt[p]),
			present:   g.view[p].live(g.cfg.Instance, g.ttl, now)}
		if seen[p].present {
			// Another member renews it: waiting for its handover is no
			// failure to acquire (warnUnacquired).
			delete(g.failing, p)
		}
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
		pending := make([][]createAttempt, len(free))
		for i, p := range free {
			pending[i] = slices.Clone(g.livePending(p))
		}
		go g.acquire(ctx, free, pending)
	}
	if len(released) > 0 {
		g.log.Info("handing partitions over to other members", "partitions", released, "members", members)
		g.setOwned()
	}
}

// post hands f to the loop, unless Run has returned; it reports which.
func (g *Group) post(f func()) bool {
	select {
	case g.events <- f:
		return true
	case <-g.quit:
		return false
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

// flushOwnedLog logs a pending change of the owned partitions at once,
// so that nothing of the group logs after Run returns (a pending timer
// that fires later finds it logged).
func (g *Group) flushOwnedLog() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.logTimer != nil {
		g.logTimer.Stop()
		g.logTimer = nil
	}
	if !slices.Equal(g.owned, g.logged) {
		g.logged = g.owned
		g.log.Info("partitions owned", "count", len(g.owned), "partitions", g.owned)
	}
}

// putMember puts this instance's member key.
func (g *Group) putMember(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, g.opTimeout())
	defer cancel()
	// A put the server's permissions deny fails with the denial (a
	// *store.DeniedError), not at its timeout.
	pctx, release := store.GuardDenied(pctx, g.nc, g.keySubject(g.memberKey()))
	defer release()
	if _, err := g.kv.Put(pctx, g.memberKey(), g.member); err != nil {
		if d := store.Denial(pctx); d != nil {
			err = d
		}
		return fmt.Errorf("group membership: %w", err)
	}
	return nil
}

// keySubject is the subject of a write of key in the lease bucket, which
// a denial names.
func (g *Group) keySubject(key string) string {
	return "$KV." + g.cfg.Stream.Name + LeaseBucketSuffix + "." + key
}
