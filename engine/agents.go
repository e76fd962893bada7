package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
)

// Agent liveness (DESIGN.md §11 "Liveness"): every reconciler instance
// watches the node lease bucket and records, in the stream, the moments
// a node's agent went down (its lease expired, was released, or was
// taken by a new agent) and came back (a lease claimed). A node's agent
// events alternate, each lease claim up once and down at most once, and
// each is published after the node's previous agent event with that
// event's sequence as the subject's expected last sequence and a message
// id derived from it: every instance of a group, or a restarted one,
// computes the same next transition with the same id, and the stream
// stores it once.
//
// The same watch records a node's provisioner client's liveness: its
// lease is the key <node>.provisioner of the same bucket
// (store.ProvisionerLeaseKey), and its transitions are prov events
// (events.Prov: an agent event's fields, on <prefix>.<node>.prov), by the
// same rules, grace and sweep. Below, a "lease key" is either; maps are
// by lease key, and each key's events are of its own kind
// (store.LeaseOf).

// agentCheck is how often the watcher looks for leases whose holder
// stopped renewing them: a key's expiry is not delivered to watchers
// (the bucket's TTL removes it silently), so a key unrenewed for its TTL
// is read again until it is gone.
const agentCheck = 250 * time.Millisecond

// sweepTimeout bounds the sweep's stream info (agentWatch.startSweep), which
// the server answers by walking every subject of the stream (60 ms of its
// CPU at 100,000 nodes on a quiet machine): a request the server never
// answers (it stopped after taking it) fails then, and is retried.
const sweepTimeout = 10 * time.Second

// sweepRetry paces the retries of a failed sweep: from the first, about
// doubling (jittered by half), to the most, without end.
const (
	sweepRetryFirst = agentCheck
	sweepRetryMost  = 30 * time.Second
)

// AgentGrace is how long a reconciler's agent liveness watch that has
// just started, or whose connection has just reconnected, waits before it
// records a node's agent down for a lease that expired: ttl (the node lease
// bucket's TTL) plus store.MaxReconnectDelay, the time a live agent takes
// to reach a server that is back and renew its lease (it renews every
// ttl/4). A lease that expired while no server ran, or while the watch
// could not reach one, is no evidence that its agent died: the bucket's
// TTL counts from the last renewal the server stored, and a live agent
// could not renew while the server was away. An agent that claims its
// lease again within the grace has no down; one that does not is recorded
// down when the grace ends. A release (a delete) and a takeover (a new
// claim) are evidence, recorded at once. See docs/architecture.md, "Agent
// liveness across a server restart".
func AgentGrace(ttl time.Duration) time.Duration { return ttl + store.MaxReconnectDelay }

// agentWatch is one reconciler instance's watch of the node lease bucket.
type agentWatch struct {
	kv     jetstream.KeyValue
	stream jetstream.Stream
	subj   events.Subjects
	pub    *store.Publisher
	key    []byte // signs message ids: see store.EffectMsgID
	// signer is the public key plans are signed with now ("" unsigned):
	// a provisioner's up says when the node's newest plan has another
	// (planLook).
	signer string
	log    *slog.Logger
	m      *Metrics
	ttl    time.Duration

	leases map[string]*nodeLease   // by lease key
	last   map[string]*agentRecord // the key's newest event (agent or prov), cached
	dirty  map[string]bool         // keys whose transition could not be recorded: retried
	now    func() time.Time

	// graceUntil is when the grace after this watch's start or its
	// connection's last reconnect ends (AgentGrace); held are the nodes
	// whose expiry down waits for it.
	graceUntil time.Time
	held       map[string]bool
	// reconnects reads the connection's reconnect count (nats.Conn's
	// Stats().Reconnects); nil: none is known. seenReconnects is the
	// count the grace was last started at.
	reconnects     func() uint64
	seenReconnects uint64
	// connected reports whether the connection is connected now
	// (nats.Conn.IsConnected); nil: taken as connected. While it is not,
	// the tick reads no lease and records nothing (expire, the dirty
	// nodes): every request would wait out its deadline on the loop.
	connected func() bool
	// expireTimeout bounds a tick's expiry pass as a whole (expire):
	// ackTimeout when 0 (tests shorten it).
	expireTimeout time.Duration
	// loaded is closed once the reconciler's first partition loads are
	// over (Reconciler.first): the sweep waits for it.
	loaded <-chan struct{}
	// folded returns the liveness record this instance's folded state
	// holds for a lease key (the node's Agent, its provisioner's
	// Provisioner), nil when it holds none (not its partition, no event);
	// foldedUp lists the lease keys whose folded record says up. Both nil:
	// no folded state (tests' watches). See agedOut.
	folded   func(key string) *reconcile.AgentRecord
	foldedUp func() []string

	// The bucket's own availability (a fresh user's finding, G1): on a
	// cluster, the server leading the bucket can crash while this
	// watch's connection stays up, and no agent can renew its lease
	// until a new leader is elected (4.5–9.8 s, beyond a 5 s TTL).
	// lookBucket reads the bucket's stream info (nil: never looked,
	// taken as available: tests' fakes). A judgement of an expiry looks
	// at most once per agentCheck (looked, the look's time); bucketAway
	// is the last look's finding of no leader or no answer, and
	// bucketLeader, bucketSince the leader it named and since when it
	// leads (zero: not said). See bucketWritable.
	lookBucket   func(ctx context.Context) (*jetstream.StreamInfo, error)
	looked       time.Time
	bucketAway   bool
	bucketLeader string
	bucketSince  time.Time

	// The bucket's writes (a fresh user's finding, M3): a loaded
	// cluster's server can stall for longer than the TTL with nothing
	// killed and no election (7 s, a 5 s TTL): the bucket stored no
	// renewal meanwhile and the leases of live agents expired. The watch
	// writes its own pulse (store.NodeLeasePulseKey) every ttl/4, off the
	// loop, as an agent renews: pulse writes it (nil: no pulse, tests'
	// fakes). pulseSent is the send of the pulse in flight (zero: none),
	// pulseAt when the next is due; pulses delivers its result.
	// stallFrom is the send of the first pulse not stored on time
	// (pulseLate) and not yet followed by one stored (zero: none).
	// pulsed: a pulse was stored since the watch started (until then a
	// pulse not stored, such as one a reconciler's older credentials do
	// not grant, is no stall). See bucketStalled.
	pulse     func(ctx context.Context) error
	pulseSent time.Time
	pulseAt   time.Time
	pulses    chan pulseResult
	stallFrom time.Time
	pulsed    bool
	pulseSaid bool // the watch said once that no pulse was stored yet

	// The sweep runs off the loop, once for every start of the grace
	// (the watch's start, a reconnect), retried until it succeeds:
	// graces counts the starts, swept is the count the last sweep that
	// succeeded was started at. sweeping delivers the result of the one
	// under way (nil: none); a failed one is tried again at sweepAt,
	// paced by sweepPace. sweepTimeout bounds its request (the constant;
	// tests shorten it).
	graces, swept uint64
	sweeping      chan sweepResult
	sweepAt       time.Time
	sweepPace     *backoff.ExponentialBackOff
	sweepTimeout  time.Duration

	// downs delivers the lease keys whose down this instance's
	// partitions folded (nil: none, tests' watches); doubted maps each
	// to when it was folded, for doubtWindow: the next put the watch
	// delivers for it is judged against the stream's newest event read
	// again, not the cache. See doubt.
	downs    *foldedDowns
	doubted  map[string]time.Time
	doubtAge time.Time // the last prune of doubted
}

// foldedDowns is the set of lease keys whose down (an agent or prov
// event) a reconciler's partitions folded, handed to its agent liveness
// watch: the fold adds, the watch takes them all when woken. A zero
// value is ready.
type foldedDowns struct {
	mu   sync.Mutex
	keys map[string]struct{}
	wake chan struct{} // holds one token while keys is not empty
}

func (d *foldedDowns) init() {
	if d.wake == nil {
		d.keys, d.wake = map[string]struct{}{}, make(chan struct{}, 1)
	}
}

// add notes key's down, folded; it never blocks the fold.
func (d *foldedDowns) add(key string) {
	d.mu.Lock()
	d.init()
	d.keys[key] = struct{}{}
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default: // a token already waits
	}
}

// woken returns the channel that is ready while keys were added since
// the last take.
func (d *foldedDowns) woken() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.init()
	return d.wake
}

// take returns the keys added since the last take.
func (d *foldedDowns) take() map[string]struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	keys := d.keys
	d.keys = map[string]struct{}{}
	return keys
}

// sweepResult is what a sweep's stream info found: the lease keys of
// the nodes with an agent event (a node's name) or a prov event (its
// provisioner's key), as of the grace start numbered grace.
type sweepResult struct {
	grace uint64
	nodes []string
	err   error
}

// pulseResult is what a pulse's write found: sent and answered are its
// send and its answer (or its failure), err its failure.
type pulseResult struct {
	sent, answered time.Time
	err            error
}

// closedChan is a closed channel: ready at once.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// nodeLease is a node's lease as the watch last saw it.
type nodeLease struct {
	present bool
	value   []byte // the holder's JSON: a renewal writes the same bytes
	holder  store.Holder
	rev     uint64
	seen    time.Time       // when it was last written, as this watch saw it
	why     events.AgentWhy // when absent: how it went
}

// agentRecord is a node's newest agent event; seq 0: none.
type agentRecord struct {
	seq   uint64
	up    bool
	claim string
	why   events.AgentWhy // a down's
	// host, pid: the holder of an up that aged out of the stream (seq 0,
	// agedOut), for its down.
	host string
	pid  int
}

// watchAgents records agent transitions until ctx ends. It returns only
// ctx's error; failures to reach the server are logged and retried.
func (r *Reconciler) watchAgents(ctx context.Context, kv jetstream.KeyValue) error {
	w := &agentWatch{kv: kv, stream: r.stream, subj: r.subj, pub: r.pub, key: r.key, log: r.log, m: r.m,
		leases: map[string]*nodeLease{}, last: map[string]*agentRecord{}, dirty: map[string]bool{}, now: time.Now,
		held: map[string]bool{}, loaded: r.first.done, sweepTimeout: sweepTimeout,
		folded: r.foldedLiveness, foldedUp: r.foldedUp, downs: &r.downs, doubted: map[string]time.Time{}}
	if r.cfg.Signer != nil {
		w.signer = r.cfg.Signer.PublicKey()
	}
	if nc := r.js.Conn(); nc != nil {
		w.reconnects = func() uint64 { return nc.Stats().Reconnects }
		w.connected = nc.IsConnected
	}
	pulse, _ := json.Marshal(store.NewHolder("reconciler", r.cfg.Stream.Name))
	w.pulse = func(ctx context.Context) error {
		_, err := kv.Put(ctx, store.NodeLeasePulseKey, pulse)
		return err
	}
	name := "KV_" + kv.Bucket()
	w.lookBucket = func(ctx context.Context) (*jetstream.StreamInfo, error) {
		s, err := r.js.Stream(ctx, name)
		if err != nil {
			return nil, err
		}
		return s.CachedInfo(), nil
	}
	for {
		err := w.run(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		w.log.Warn("agent liveness watch stopped; starting it again", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// run watches the bucket from its current values until ctx ends or the
// watch fails.
func (w *agentWatch) run(ctx context.Context) error {
	// rctx ends the sweep under way when the watch does.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w.sweeping = nil
	w.pulses, w.pulseSent, w.pulseAt, w.stallFrom, w.pulsed = nil, time.Time{}, time.Time{}, time.Time{}, false
	sctx, scancel := context.WithTimeout(ctx, ackTimeout)
	st, err := w.kv.Status(sctx)
	scancel()
	if err != nil {
		return err
	}
	if w.ttl = st.TTL(); w.ttl <= 0 {
		return fmt.Errorf("node lease bucket %s has no TTL", w.kv.Bucket())
	}
	w.startGrace("the watch started")
	if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		w.sawBucket(bs.StreamInfo())
	}
	watcher, err := w.kv.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer func() {
		// Stopping deletes the watch's consumer, a request the stop need
		// not wait for: against a server that is gone (kill -9) it
		// waited out the client's 5 s timeout. What the watch still
		// delivers is drained; the channel closes once it is stopped.
		go func() {
			_ = watcher.Stop()
			for range watcher.Updates() {
			}
		}()
	}()
	tick := time.NewTicker(agentCheck)
	defer tick.Stop()
	var downs <-chan struct{} // never ready without a fold (tests' watches)
	if w.downs != nil {
		downs = w.downs.woken()
	}
	initial := true
	// sweepDue is the reconciler's first loads, once the watch's initial
	// values are in: the sweep's stream info walks every subject of the
	// stream on the server, and waits until a restart's partitions have
	// refolded their tails and read their states (issue 27). sweepOpen:
	// it has been ready.
	var sweepDue <-chan struct{}
	sweepOpen := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-watcher.Updates():
			if !ok {
				return errors.New("the watch ended")
			}
			if e == nil {
				if initial {
					initial = false
					if sweepDue = w.loaded; sweepDue == nil {
						sweepDue = closedChan
					}
				}
				continue
			}
			w.entry(ctx, e)
		case <-sweepDue:
			sweepDue, sweepOpen = nil, true
			w.startSweep(rctx)
		case res := <-w.sweeping:
			w.sweeping = nil
			w.sweepDone(ctx, res)
		case res := <-w.pulses:
			w.pulses = nil
			w.pulseDone(res)
		case <-downs:
			w.doubt(w.downs.take())
		case <-tick.C:
			w.inGrace() // starts a grace when the connection reconnected
			w.startPulse(rctx)
			w.pruneDoubted()
			if sweepOpen {
				w.startSweep(rctx)
			}
			if w.connected != nil && !w.connected() {
				// No server: each read and record would wait out its
				// deadline on the loop. The next tick after the
				// reconnect does them, in the grace it starts.
				continue
			}
			w.expire(ctx)
			for node := range w.dirty {
				w.sync(ctx, node)
			}
			if len(w.held) > 0 && !w.inGrace() && w.bucketWritable(ctx) {
				w.log.Info("agent liveness: grace over; recording the downs of the leases not renewed in it", "nodes", len(w.held))
				for node := range w.held {
					w.sync(ctx, node)
				}
			}
		}
	}
}

// startGrace starts the grace of AgentGrace(ttl) from now: a server may
// have been away, and its agents' leases expired meanwhile.
func (w *agentWatch) startGrace(why string) {
	if w.reconnects != nil {
		w.seenReconnects = w.reconnects()
	}
	// A sweep is owed for this start, at once.
	w.graces++
	w.sweepAt = time.Time{}
	w.sweepPace = nil
	grace := AgentGrace(w.ttl)
	w.graceUntil = w.now().Add(grace)
	w.log.Debug("agent liveness: an expired lease is recorded down only after a grace", "why", why, "grace", grace)
}

// inGrace reports whether the grace after the watch's start or its last
// reconnect still runs, starting one when the connection has reconnected
// since the last: read at the moment of a judgement, so that a lease read
// missing by a request answered after a reconnect (the expiry poll's get,
// blocked through the outage) is judged in the grace the reconnect starts.
// nats.Conn counts a reconnect before it sends anything on the new
// connection.
func (w *agentWatch) inGrace() bool {
	if w.reconnects != nil && w.reconnects() != w.seenReconnects {
		w.startGrace("the connection reconnected")
	}
	return w.now().Before(w.graceUntil)
}

// bucketLook bounds a look at the bucket's leader (bucketWritable): it is
// made on the loop, at most once per agentCheck, and only while an
// expiry is being judged.
const bucketLook = time.Second

// bucketWritable reports whether an expiry is evidence of death as far as
// the bucket itself goes: it has a leader now, and has had it for longer
// than the grace (AgentGrace). A lease expires on every replica when no
// leader stored its renewals (the server leading the bucket crashed, the
// election takes seconds), while its agent lives and retries; so an
// expiry judged while the bucket has no leader, or answers no look
// within bucketLook, is held, and one judged within the grace after the
// leader's election (the stream info's leader_since; when the server
// does not say, the first look that saw the new leader) waits for the
// grace's end, as after a reconnect: the election moves graceUntil. The
// look is made at most once per agentCheck; false while the bucket is
// away, and then the held nodes are judged again at a later tick.
func (w *agentWatch) bucketWritable(ctx context.Context) bool {
	if w.bucketStalled() {
		return false
	}
	if w.lookBucket == nil {
		return !w.inGrace()
	}
	if now := w.now(); w.looked.IsZero() || now.Sub(w.looked) >= agentCheck {
		w.looked = now
		lctx, cancel := context.WithTimeout(ctx, bucketLook)
		info, err := w.lookBucket(lctx)
		cancel()
		if err != nil {
			if !w.bucketAway {
				w.log.Info("agent liveness: the node lease bucket answers no look; expired leases are held until it has a leader again", "err", err)
			}
			w.bucketAway = true
		} else {
			w.sawBucket(info)
		}
	}
	return !w.bucketAway && !w.inGrace()
}

// sawBucket takes what a look at the bucket's stream info found: no
// leader (away), or a leader; a leader elected since the last look (or
// seen after one that found none) starts a grace from its election.
func (w *agentWatch) sawBucket(info *jetstream.StreamInfo) {
	if info == nil || info.Cluster == nil || len(info.Cluster.Replicas) == 0 && info.Cluster.Leader == "" {
		w.bucketAway = false // not replicated: a server that answers has it
		return
	}
	c := info.Cluster
	if c.Leader == "" {
		if !w.bucketAway {
			w.log.Info("agent liveness: the node lease bucket has no leader; expired leases are held until it has one again")
		}
		w.bucketAway = true
		return
	}
	var since time.Time
	if c.LeaderSince != nil {
		since = *c.LeaderSince
	}
	first := w.bucketLeader == ""
	changed := c.Leader != w.bucketLeader || !since.Equal(w.bucketSince) || w.bucketAway
	w.bucketLeader, w.bucketSince = c.Leader, since
	w.bucketAway = false
	if !changed {
		return
	}
	from := since
	if from.IsZero() {
		if first {
			return // the watch's start: its own grace covers it
		}
		from = w.now()
	}
	from = minTime(from, w.now())
	if until := from.Add(AgentGrace(w.ttl)); until.After(w.graceUntil) {
		w.graceUntil = until
		w.log.Info("agent liveness: the node lease bucket has a new leader; leases that expired without one are judged after a grace",
			"leader", c.Leader, "since", from, "grace_until", until)
	}
}

// minTime returns the earlier of a and b.
func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// pulseLate is how long a pulse's write may go unanswered before the
// bucket is taken as stalled. A stall can expire a live agent's lease
// only when it lasts at least three quarters of the TTL (the agent
// renewed at most a quarter before it began), and a pulse is sent at
// most a quarter of the TTL and a tick (agentCheck) after it began: that
// pulse is unanswered for half the TTL less a tick (2.25 s of a 5 s TTL)
// before any lease the stall expired can be judged, and is late then.
// A write slower than that on a sound bucket starts a grace for nothing
// worse than a dead agent's down recorded a grace later. Never less than
// a quarter of the TTL (a TTL under a second).
func pulseLate(ttl time.Duration) time.Duration { return max(ttl/2-agentCheck, ttl/4) }

// pulseUnstored paces the pulses while none has been stored since the
// watch started (pulseDone).
const pulseUnstored = time.Minute

// startPulse sends the pulse that is due, off the loop, unless one is in
// flight. Its write is bounded by the TTL: one unanswered for so long is
// a stall already, and the next pulse asks again.
func (w *agentWatch) startPulse(ctx context.Context) {
	if w.pulse == nil || w.pulses != nil || w.now().Before(w.pulseAt) {
		return
	}
	res := make(chan pulseResult, 1)
	w.pulses = res
	sent, ttl, pulse, now := w.now(), w.ttl, w.pulse, w.now
	w.pulseSent = sent
	go func() {
		pctx, cancel := context.WithTimeout(ctx, ttl)
		defer cancel()
		err := pulse(pctx)
		res <- pulseResult{sent: sent, answered: now(), err: err}
	}()
}

// pulseDone takes a pulse's result. A pulse stored on time ends nothing;
// one stored late, or the first stored after pulses that were not, ends
// a stall of the bucket: a grace (stallGrace) runs from its answer, as
// from a reconnect or an election, so a live agent whose lease expired
// in the stall claims it again before its expiry is judged.
func (w *agentWatch) pulseDone(res pulseResult) {
	w.pulseSent = time.Time{}
	w.pulseAt = res.answered.Add(w.ttl / 4) // an agent's renewal period
	late := res.answered.Sub(res.sent) >= pulseLate(w.ttl)
	if res.err != nil {
		switch {
		case !w.pulsed:
			// Never stored since the watch started: older reconciler
			// credentials without the pulse's grant (a denied publish is
			// answered by nothing, and the connection logs the denial at
			// ERROR), or a start under a stall. Asked again each minute,
			// not each tick.
			w.pulseAt = res.answered.Add(pulseUnstored)
			level := slog.LevelInfo
			if w.pulseSaid {
				level = slog.LevelDebug
			}
			w.pulseSaid = true
			w.log.Log(context.Background(), level, "agent liveness: the node lease bucket stored no pulse of this reconciler yet: a stall of the bucket is not told from an agent's death until it does "+
				"(credentials from an older 'meshfold auth' do not grant it: issue them again); asking again each minute",
				"key", store.NodeLeasePulseKey, "err", res.err)
			return
		case w.stallFrom.IsZero():
			w.stallFrom = res.sent
			w.log.Info("agent liveness: the node lease bucket stores no write; expired leases are held until it does",
				"since", res.sent, "err", res.err)
		}
		w.pulseAt = res.answered
		return
	}
	w.pulsed = true
	from := w.stallFrom
	if from.IsZero() {
		if !late {
			return
		}
		from = res.sent
	}
	w.stallFrom = time.Time{}
	until := res.answered.Add(stallGrace(w.ttl))
	if until.After(w.graceUntil) {
		w.graceUntil = until
	}
	w.log.Info("agent liveness: the node lease bucket stored no write for a while; leases that expired meanwhile are judged after a grace",
		"stalled", res.answered.Sub(from).Round(time.Millisecond), "since", from, "grace_until", w.graceUntil)
}

// stallGrace is the grace after a stall of the bucket ends (a pulse
// stored late): the TTL. No connection dropped, so no reconnect's delay
// (store.MaxReconnectDelay) is owed: a live agent asks again every TTL/4
// and claims its expired lease again at its first ask the bucket answers.
// Shorter than AgentGrace, so that a dead agent's down is not put off by
// more than the stall and a TTL on a bucket whose writes are often late.
func stallGrace(ttl time.Duration) time.Duration { return ttl }

// bucketStalled reports whether the bucket is stalled as far as the
// watch's pulses tell: one was not stored and none was since, or the one
// in flight is late (pulseLate). An expiry judged meanwhile is held.
func (w *agentWatch) bucketStalled() bool {
	if !w.pulsed {
		return false
	}
	return !w.stallFrom.IsZero() || !w.pulseSent.IsZero() && w.now().Sub(w.pulseSent) >= pulseLate(w.ttl)
}

// entry takes one change of the bucket.
func (w *agentWatch) entry(ctx context.Context, e jetstream.KeyValueEntry) {
	node := e.Key()
	if _, _, ok := store.LeaseOf(node); !ok {
		return
	}
	ls := w.leases[node]
	if ls == nil {
		ls = &nodeLease{}
		w.leases[node] = ls
	}
	if e.Revision() < ls.rev {
		return // older than what a direct read already gave
	}
	ls.rev = e.Revision()
	switch e.Operation() {
	case jetstream.KeyValuePut:
		ls.seen = w.now()
		if _, ok := w.doubted[node]; ok {
			// A put after a down of this key was folded: the lease was
			// written since. Judged from the newest event, read again
			// (doubt): a live agent's down is followed by its up.
			delete(w.doubted, node)
			delete(w.last, node)
			if ls.present && bytes.Equal(ls.value, e.Value()) {
				w.sync(ctx, node)
				return
			}
		}
		if ls.present && bytes.Equal(ls.value, e.Value()) {
			return // a renewal
		}
		var h store.Holder
		if err := json.Unmarshal(e.Value(), &h); err != nil || h.Token == "" {
			w.log.Warn("agent liveness: a node lease that names no holder", "node", node, "err", err)
			return
		}
		ls.present, ls.value, ls.holder = true, bytes.Clone(e.Value()), h
	case jetstream.KeyValueDelete:
		ls.present, ls.why = false, events.WhyReleased
	default: // a purge, or the server's marker of a key its TTL removed
		ls.present, ls.why = false, events.WhyExpired
	}
	w.sync(ctx, node)
}

// doubtWindow is how long after a down of a lease key is folded the
// watch takes the key's next put as a reason to read its newest event
// again (doubt): the grace after a server or the bucket's leader came
// back (AgentGrace), twice, as the down may be folded while the bucket
// still elects its leader.
func doubtWindow(ttl time.Duration) time.Duration { return 2 * AgentGrace(ttl) }

// doubt takes the lease keys whose down this instance's partitions
// folded. A down can be stored after the watch last judged the key, and
// after the lease's renewal was seen: a down appended while the stream's
// leader had lost its quorum (2 of 3 servers killed) is taken into its
// log unanswered, and stored when the quorum is back, seconds after the
// watch gave up on it, read the node's newest event (still the up),
// cached it, and saw the agent's renewal as nothing new (a fresh user's
// finding, G1: live agents recorded down until their next have, up to
// --resync). The cache of each key is dropped, and the key's next put
// within doubtWindow is judged again: a live agent renews within a
// quarter of the TTL, so its up follows its down; a dead one writes no
// put. The cost is one map entry per down folded, and one read of the
// newest event per doubted key the watch judges.
func (w *agentWatch) doubt(keys map[string]struct{}) {
	now := w.now()
	for key := range keys {
		if _, _, ok := store.LeaseOf(key); !ok {
			continue
		}
		delete(w.last, key)
		w.doubted[key] = now
	}
}

// pruneDoubted drops the doubted keys whose window is over, at most once
// per TTL.
func (w *agentWatch) pruneDoubted() {
	now := w.now()
	if len(w.doubted) == 0 || now.Before(w.doubtAge) {
		return
	}
	w.doubtAge = now.Add(w.ttl)
	window := doubtWindow(w.ttl)
	for key, at := range w.doubted {
		if now.Sub(at) >= window {
			delete(w.doubted, key)
		}
	}
}

// expire reads again every present lease unrenewed for longer than the
// TTL: gone, its holder is down. The pass's reads share one deadline,
// expireTimeout, and the pass ends at the first read that got no answer
// ([store.Unanswered]): the others would wait as long. Each read had its
// own 5 s deadline: with the server down, N unrenewed leases held the
// loop N×5 s, and no release, claim or expiry was judged meanwhile. The
// leases not read are read at the next tick (in the map's random order,
// so none waits behind the same ones).
func (w *agentWatch) expire(ctx context.Context) {
	now := w.now()
	d := w.expireTimeout
	if d <= 0 {
		d = ackTimeout
	}
	pctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for node, ls := range w.leases {
		if !ls.present || now.Sub(ls.seen) < w.ttl {
			continue
		}
		e, err := w.kv.Get(pctx, node)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
			ls.present, ls.why = false, events.WhyExpired
			w.sync(ctx, node)
		case err != nil:
			w.log.Warn("agent liveness: lease not read", "node", node, "err", err)
			if store.Unanswered(err) || pctx.Err() != nil {
				return
			}
		case e.Revision() > ls.rev:
			w.entry(ctx, e) // renewed: the watch will say so too
		}
	}
}

// The sweep finds the nodes whose newest agent event says up while the
// bucket holds no lease for them: agents that went down while no
// reconciler watched (a restart of the reconciler while a node is down
// records its down once, and loses none), or while this one's connection
// was away. Its stream info runs off the loop, under sweepTimeout, so the
// loop judges leases meanwhile: a request the server never answers (it
// stopped after taking it) blocked the loop until the watch ended, and no
// expiry was judged meanwhile. It runs once for every start of the grace
// (the watch's start, each reconnect) and is retried until it succeeds.

// startSweep starts the sweep owed, unless one is under way or a failed
// one's retry is not due.
func (w *agentWatch) startSweep(ctx context.Context) {
	if w.swept == w.graces || w.sweeping != nil || w.now().Before(w.sweepAt) {
		return
	}
	res := make(chan sweepResult, 1)
	w.sweeping = res
	grace, timeout := w.graces, w.sweepTimeout
	go func() {
		sctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		nodes, err := store.ListNodes(sctx, w.stream, w.subj, events.KindAgent)
		if err == nil {
			var provs []string
			provs, err = store.ListNodes(sctx, w.stream, w.subj, events.KindProv)
			for _, n := range provs {
				nodes = append(nodes, store.ProvisionerLeaseKey(n))
			}
		}
		res <- sweepResult{grace: grace, nodes: nodes, err: err}
	}()
}

// sweepDone takes a sweep's result: each node it lists that the watch has
// seen no lease of is judged as one whose lease expired; a failure is
// retried after the sweep's pace.
func (w *agentWatch) sweepDone(ctx context.Context, res sweepResult) {
	if res.err != nil {
		if w.sweepPace == nil {
			w.sweepPace = backoff.NewExponentialBackOff(backoff.WithInitialInterval(sweepRetryFirst),
				backoff.WithMultiplier(2), backoff.WithMaxInterval(sweepRetryMost), backoff.WithMaxElapsedTime(0))
		}
		wait := w.sweepPace.NextBackOff()
		w.sweepAt = w.now().Add(wait)
		w.log.Warn("agent liveness: nodes whose agent went down while no reconciler watched not checked yet; retrying",
			"err", res.err, "in", wait)
		return
	}
	w.swept, w.sweepAt, w.sweepPace = max(w.swept, res.grace), time.Time{}, nil
	nodes := res.nodes
	if w.foldedUp != nil {
		// The nodes whose up aged out of the stream (serve --max-age)
		// are listed by no subject; their folded state still says up.
		nodes = append(nodes, w.foldedUp()...)
	}
	for _, node := range nodes {
		if ls := w.leases[node]; ls != nil {
			continue // seen in the bucket: synced already
		}
		w.leases[node] = &nodeLease{why: events.WhyExpired}
		w.sync(ctx, node)
	}
}

// lastRecord returns the node's newest agent event, from the cache or a
// direct get.
func (w *agentWatch) lastRecord(ctx context.Context, key string) (*agentRecord, error) {
	if rec := w.last[key]; rec != nil {
		return rec, nil
	}
	node, kind, _ := store.LeaseOf(key)
	gctx, cancel := context.WithTimeout(ctx, ackTimeout)
	m, err := store.LastMsg(gctx, w.stream, w.subj, node, kind)
	cancel()
	switch {
	case errors.Is(err, store.ErrNoMessage):
		rec := w.agedOut(key)
		w.last[key] = rec
		return rec, nil
	case err != nil:
		return nil, err
	}
	rec := &agentRecord{seq: m.Event.Seq}
	if a, ok := livenessOf(m.Event.Payload); ok {
		rec.up, rec.claim, rec.why = a.State == events.AgentUp, a.Claim, a.Why
	} else {
		// Not understood (a newer schema): taken as a down of no claim,
		// so what the bucket holds now is recorded after it.
		rec.up = false
	}
	w.last[key] = rec
	return rec, nil
}

// agedOut returns the record of a lease key whose stream subject holds
// no event (seq 0, so that the next transition expects none): no agent
// event was ever recorded, or the newest aged out of the stream (serve
// --max-age shorter than an agent's life). In the second case the claim
// is still up as far as the reconciler's state, fleet and metrics go, and
// its down must be recorded when its lease goes: the watch recorded
// nothing (a fresh user's finding F6: a down expecting the aged-out up's
// sequence met an empty subject, a conflict; read again, the subject said
// "no event", and the down was dropped without a word, for as long as
// serve ran). The claim up is the folded state's, when this instance
// holds the node's state and it names one; else the lease this watch saw
// held (a claim the stream holds no event of: up, as far as the watch
// knows).
func (w *agentWatch) agedOut(key string) *agentRecord {
	rec := &agentRecord{}
	if w.folded != nil {
		if a := w.folded(key); a != nil && a.Up && a.Claim != "" {
			rec.up, rec.claim, rec.host, rec.pid = true, a.Claim, a.Host, a.PID
			return rec
		}
	}
	if ls := w.leases[key]; ls != nil && ls.holder.Token != "" {
		rec.up, rec.claim, rec.host, rec.pid = true, ls.holder.Token, ls.holder.Host, ls.holder.PID
	}
	return rec
}

// livenessOf returns the agent event an agent or prov payload carries.
func livenessOf(p events.Payload) (*events.Agent, bool) {
	switch a := p.(type) {
	case *events.Agent:
		return a, true
	case *events.Prov:
		return &a.Agent, true
	}
	return nil, false
}

// next returns the agent event that moves rec towards what the bucket
// says (ls), or nil when rec already says it: a claim seen while the
// newest event is a down (or none) is up; a claim other than the one
// recorded up is first that one's down (replaced); no lease while the
// newest event is up is that claim's down. A claim recorded down as
// released or replaced is over (its agent never writes that lease
// again; an expired one's may, claiming it again): seen again, it is a
// view behind the bucket's, and nil. An instance whose watch lagged
// (-race on a loaded machine) recorded "up c3" after another had
// recorded c3's release, then c3's release again.
func (w *agentWatch) next(rec *agentRecord, ls *nodeLease) *events.Agent {
	switch {
	case ls.present && !rec.up && rec.seq != 0 && rec.claim == ls.holder.Token &&
		(rec.why == events.WhyReleased || rec.why == events.WhyReplaced):
		return nil
	case ls.present && (!rec.up || rec.seq == 0):
		return &events.Agent{State: events.AgentUp, Claim: ls.holder.Token, Host: ls.holder.Host, PID: ls.holder.PID, Trusts: trusts(ls.holder.Trusts)}
	case ls.present && rec.claim != ls.holder.Token:
		return &events.Agent{State: events.AgentDown, Claim: rec.claim, Why: events.WhyReplaced}
	case !ls.present && rec.up:
		why := ls.why
		if why == "" {
			why = events.WhyExpired
		}
		return &events.Agent{State: events.AgentDown, Claim: rec.claim, Why: why}
	}
	return nil
}

// sync records the node's transitions until its newest agent event says
// what the bucket says. A conflict (another instance recorded one first)
// reads the newest event again; any other failure leaves the node dirty
// for the next tick.
func (w *agentWatch) sync(ctx context.Context, node string) {
	delete(w.dirty, node)
	delete(w.held, node)
	ls := w.leases[node]
	for attempt := 0; attempt < 8; attempt++ {
		rec, err := w.lastRecord(ctx, node)
		if err != nil {
			w.fail(node, err)
			return
		}
		a := w.next(rec, ls)
		if a == nil {
			return
		}
		if w.newerLease(ctx, node, ls) {
			// This instance's view of the lease was behind the bucket
			// (another instance may have recorded from the newer one):
			// judge again from what the bucket holds now.
			continue
		}
		if a.State == events.AgentDown && a.Why == events.WhyExpired && (w.inGrace() || !w.bucketWritable(ctx)) {
			// Expired while the server may have been away, or while the
			// bucket had no leader to store a renewal: the agent has
			// until the grace ends to claim its lease again.
			w.held[node] = true
			return
		}
		if a.State == events.AgentDown && rec.seq == 0 && a.Host == "" {
			a.Host, a.PID = rec.host, rec.pid // its up aged out: agedOut
		}
		if a.State == events.AgentDown && rec.claim != "" && a.Host == "" {
			// The down names the holder its up named.
			if prev, ok := w.upHolder(ctx, node, rec); ok {
				a.Host, a.PID = prev.Host, prev.PID
			}
		}
		name, kind, _ := store.LeaseOf(node)
		var p events.Payload = a
		if kind == events.KindProv {
			pv := &events.Prov{Agent: *a}
			if a.State == events.AgentUp {
				pv.NoPlan, pv.OldKey, pv.LookedBefore = w.planLook(ctx, name)
			}
			p = pv
		}
		id := store.EffectMsgID(w.key, fmt.Sprintf("%s.%s.%d.0", name, kind, rec.seq))
		actx, cancel := context.WithTimeout(ctx, ackTimeout)
		ack, err := w.pub.Append(actx, name, events.Stamp(p, w.now()), store.WithMsgID(id), store.WithExpectLastSubjectSeq(rec.seq))
		cancel()
		switch {
		case errors.Is(err, store.ErrConflict) || (err == nil && ack.Duplicate):
			delete(w.last, node) // another instance recorded one: read it
			continue
		case err != nil:
			w.fail(node, err)
			return
		}
		w.last[node] = &agentRecord{seq: ack.Seq, up: a.State == events.AgentUp, claim: a.Claim, why: a.Why}
		if a.State == events.AgentDown && !ls.present && ls.holder.Token == a.Claim {
			// Its down is recorded: once that ages out too, the claim
			// is no up to record a down of again (agedOut).
			ls.holder = store.Holder{}
		}
		if kind == events.KindProv {
			w.log.Info("provisioner "+string(a.State), "node", name, "claim", a.Claim, "why", a.Why, "host", a.Host, "pid", a.PID, "seq", ack.Seq)
			continue
		}
		if w.m != nil && w.m.Agents != nil {
			w.m.Agents.WithLabelValues(string(a.State)).Inc()
		}
		w.log.Info("node agent "+string(a.State), "node", node, "claim", a.Claim, "why", a.Why, "host", a.Host, "pid", a.PID, "seq", ack.Seq)
	}
	w.dirty[node] = true
}

// planLook reads node's newest plan for a provisioner's up and reports
// whether the stream holds none (events.Prov.NoPlan: the stream's
// --max-age removed a quiet node's plan) or one signed by another key
// than the one this reconciler signs with (events.Prov.OldKey: a
// rotation's retired key, which a provisioner started after the
// rotation's --finish refuses), with the sequence the look covered the
// stream before (its last sequence then, plus one). The provisioner that
// came up would find no plan to fill by; the fold publishes the plan
// again. A failed read says neither: the up is recorded as before.
func (w *agentWatch) planLook(ctx context.Context, node string) (noPlan, oldKey bool, looked uint64) {
	gctx, cancel := context.WithTimeout(ctx, ackTimeout)
	defer cancel()
	last, err := store.StreamLastSeq(gctx, w.stream)
	if err != nil {
		return false, false, 0
	}
	m, err := store.LastMsg(gctx, w.stream, w.subj, node, events.KindPlan)
	switch {
	case errors.Is(err, store.ErrNoMessage):
		return true, false, last + 1
	case err != nil:
		return false, false, 0
	case w.signer != "" && m.Signer != "" && m.Signer != w.signer:
		return false, true, last + 1
	}
	return false, false, 0
}

// newerLease reads node's lease directly and, when the bucket holds a put
// newer than the watch has delivered, takes it into ls and reports true:
// a transition is recorded only from a lease view no older than the
// bucket's. Without it, an instance whose watch had not yet delivered
// c4's claim, reading the up of c4 another instance had recorded,
// recorded "down c4 released" from the delete of c3 it had seen last.
func (w *agentWatch) newerLease(ctx context.Context, node string, ls *nodeLease) bool {
	gctx, cancel := context.WithTimeout(ctx, ackTimeout)
	e, err := w.kv.Get(gctx, node)
	cancel()
	if err != nil || e.Revision() <= ls.rev || e.Operation() != jetstream.KeyValuePut {
		return false
	}
	var h store.Holder
	if err := json.Unmarshal(e.Value(), &h); err != nil || h.Token == "" {
		return false
	}
	ls.rev, ls.seen = e.Revision(), w.now()
	ls.present, ls.value, ls.holder = true, bytes.Clone(e.Value()), h
	return true
}

// upHolder returns the holder the node's newest agent event (an up of
// rec's claim) named.
func (w *agentWatch) upHolder(ctx context.Context, node string, rec *agentRecord) (*events.Agent, bool) {
	if ls := w.leases[node]; ls != nil && ls.holder.Token == rec.claim {
		return &events.Agent{Host: ls.holder.Host, PID: ls.holder.PID}, true
	}
	gctx, cancel := context.WithTimeout(ctx, ackTimeout)
	name, kind, _ := store.LeaseOf(node)
	m, err := store.LastMsg(gctx, w.stream, w.subj, name, kind)
	cancel()
	if err != nil || m.Event.Seq != rec.seq {
		return nil, false
	}
	return livenessOf(m.Event.Payload)
}

func (w *agentWatch) fail(node string, err error) {
	delete(w.last, node)
	w.dirty[node] = true
	w.log.Log(context.Background(), failLevel(err), "agent liveness: transition not recorded yet; retrying", "node", node, "err", err)
}

// failLevel is the level of a transition's failed append: a duplicate in
// process is another instance of the group recording the same transition
// (the same message id) at the same moment, no failure: the next pass
// reads it (a fresh user's finding V9: grouped reconcilers warned of it).
func failLevel(err error) slog.Level {
	if store.DuplicateInProcess(err) {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}

// foldedLiveness returns the liveness record this instance's folded state
// holds for a lease key (a copy), nil when it holds none.
func (r *Reconciler) foldedLiveness(key string) *reconcile.AgentRecord {
	node, kind, ok := store.LeaseOf(key)
	if !ok {
		return nil
	}
	r.mu.RLock()
	p := r.parts[r.subj.Partition(node)]
	r.mu.RUnlock()
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.states[node]
	if st == nil {
		return nil
	}
	a := st.Agent
	if kind == events.KindProv {
		a = st.Provisioner
	}
	if a == nil {
		return nil
	}
	c := *a
	return &c
}

// foldedUp returns the lease keys whose liveness record in this
// instance's folded state says up with a claim.
func (r *Reconciler) foldedUp() []string {
	parts := r.partitionsHeld()
	var out []string
	for _, p := range parts {
		p.mu.Lock()
		for n, st := range p.states {
			if a := st.Agent; a != nil && a.Up && a.Claim != "" {
				out = append(out, n)
			}
			if a := st.Provisioner; a != nil && a.Up && a.Claim != "" {
				out = append(out, store.ProvisionerLeaseKey(n))
			}
		}
		p.mu.Unlock()
	}
	return out
}

// trusts is a lease holder's trusted keys as its up event carries them
// (events.Agent.Trusts): none when the record lists more than the event
// takes, or one that is no key's text (a holder record is anyone's with
// the bucket's write permission; the up event must validate).
func trusts(keys []string) []string {
	if len(keys) == 0 || len(keys) > events.MaxTrusts {
		return nil
	}
	for _, k := range keys {
		if k == "" || len(k) > events.MaxKey || strings.ContainsFunc(k, func(r rune) bool { return !(r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') }) {
			return nil
		}
	}
	return slices.Clone(keys)
}
