package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/tracing"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
)

// Reconciler defaults.
const (
	DefaultSnapshotEvery    = 1000
	DefaultSnapshotInterval = time.Second
	// DefaultRecoveryCheckpointInterval: see
	// ReconcilerConfig.RecoveryCheckpointInterval. Twice the default
	// lease TTL: a lease lost mid-catch-up then costs at most twice the
	// wait for its expiry in refold, and a catch-up shorter than it
	// (100,000 nodes on four instances at ~40 s) writes each state no
	// more often than before.
	DefaultRecoveryCheckpointInterval = 30 * time.Second
)

// ReconcilerConfig configures a [Reconciler].
type ReconcilerConfig struct {
	// Stream is the stream's effective configuration, as [EnsureStream]
	// returns it.
	Stream store.StreamConfig
	// Assigned are the partitions this instance folds for its whole run
	// (a set, each 0..N-1; nil: all). Ignored when Grants is set. Not to
	// be confused with Stream.Partitions, the count N.
	Assigned []int
	// Grants, when set, makes ownership dynamic: the instance folds a
	// partition from the moment a [Grant] for it arrives until the
	// grant is revoked, and no other partition. [Group.Grants] supplies
	// them. A closed channel grants nothing more. Nil: the fixed
	// Assigned.
	Grants <-chan Grant
	// SnapshotEvery writes a partition's checkpoint after this many events
	// (default 1000); SnapshotInterval at least this often while events
	// arrive (default 1 s). A changed node state is put at the latest four
	// checkpoints later, so a restart refolds at most the last four
	// checkpoint periods of a partition (docs/architecture.md, "Live:
	// states put by age").
	SnapshotEvery    int
	SnapshotInterval time.Duration
	// RecoveryCheckpointInterval is the least time between two
	// checkpoints of a session refolding what an earlier run may have
	// published (a restart's or a taken-over partition's catch-up),
	// written only where every effect deferred so far was seen stored.
	// Default: DefaultRecoveryCheckpointInterval, or SnapshotInterval
	// when longer. It bounds what a lease lost mid-catch-up (or a crash)
	// throws away; each costs a put of every state changed since the
	// last, and a cold catch-up changes most states again before its end
	// (three times each in the bench's mix), so it is kept well above the
	// snapshot interval.
	RecoveryCheckpointInterval time.Duration
	// FleetJournalEvery is the least time between two entries of the
	// fleet-wide journal (default [FleetJournalEvery]).
	FleetJournalEvery time.Duration
	Logger            *slog.Logger
	// Metrics, when set, records what the loop does.
	Metrics *Metrics
	// Writes, when set, is the JetStream context the reconciler writes
	// through: its effects (plans, knocks, journal entries, the fleet's
	// and the agents' entries) and its snapshot puts and checkpoints; it
	// reads through the one NewReconciler is given. A context on a
	// connection of its own (store.Companion, as [Serve] opens one) keeps
	// the partitions' pull requests off the connection that carries
	// thousands of asynchronous publishes at once: sharing one, a
	// partition's pull went unanswered now and then and its read waited
	// for two missed heartbeats (docs/architecture.md, "The reconciler
	// writes on a connection of its own"). Create it with
	// jetstream.WithPublishAsyncTimeout, as the reading one. Nil: the
	// reading context writes too.
	Writes jetstream.JetStream
	// RestPasses bounds how many restart passes over the states a tail
	// did not name (a lazy session's, beside the fold) read at once, for
	// every partition of this Reconciler (one a process in `serve` and
	// `reconcile`, so process-wide there); a partition's pass waits for a
	// slot. 0: the default,
	// half of GOMAXPROCS, at least 1 (docs/architecture.md, "What the
	// restart goal measures").
	RestPasses int
	// Faults are hooks for crash tests; nil hooks do nothing.
	Faults Faults
	// Signer signs every plan and knock published (docs/architecture.md,
	// "Signed effects"). Own are the public keys whose plan events count
	// as this reconciler's: nil means Signer's alone; after a rotation,
	// the new key and every key it signed with before, so that a refold
	// of older plans finds them its own. A plan event whose signature
	// does not verify against Own is folded as foreign (events.Event
	// Foreign): journaled, and the last plan published again. A nil
	// Signer publishes unsigned effects and takes every plan event as its
	// own (tests of the loop alone).
	Signer *store.Signer
	Own    *store.Trust
	// Tracing, when set, traces the fold of each input event and the
	// publish of each effect it causes (docs/operations.md, "Traces"):
	// the fold's span is a child of the event's traceparent, each effect's
	// publish a child of the fold, and the effect carries the publish's
	// traceparent to its readers. The refold of a session's recovery is
	// not traced. Nil traces nothing, at the cost of a nil check an
	// event.
	Tracing trace.TracerProvider

	// tuning is this reconciler's own value of bounds tests change; the
	// zero value is the package's.
	tuning tuning
}

// Faults are test hooks at the loop's crash points. A hook that returns an
// error stops the whole Reconciler at once, as a crash would: nothing more
// is published, acknowledged or checkpointed, and Run returns the error.
type Faults struct {
	// AfterFold runs after an event is folded, before its effects are
	// published.
	AfterFold func(partition int, seq uint64) error
	// AfterPublish runs after an event's effects are sent, before the
	// checkpoint that covers it.
	AfterPublish func(partition int, seq uint64) error
	// AfterCheckpoint runs after a checkpoint is stored.
	AfterCheckpoint func(partition int, seq uint64) error
	// BeforeRest runs on a restart's pass over the states its tail did
	// not name (a lazy session's), before it reads them, beside the
	// fold; ctx ends with the session. Holding it holds the pass; its
	// error ends the session.
	BeforeRest func(ctx context.Context, partition int) error
	// AfterEffectSent runs after an effect (id, its message id) is first
	// sent, before its acknowledgement is taken.
	AfterEffectSent func(partition int, id string)
	// EffectAnswer runs before each send of an effect, the first and
	// each again, on a recovery's fenced paths (a refold's publishing
	// and a first refold's early publishing; id, its message id); an
	// error it returns is taken as the server's answer to that send, and
	// the effect is not sent.
	EffectAnswer func(partition int, id string) error
	// BeforeFollow runs before each request creating a session's
	// consumer (from, the first sequence it asks for); an error it
	// returns is taken as that request's answer, not as a crash.
	BeforeFollow func(partition int, from uint64) error
}

// faultError marks an error a fault hook returned.
type faultError struct{ err error }

func (e *faultError) Error() string { return "fault: " + e.err.Error() }
func (e *faultError) Unwrap() error { return e.err }

func fault(hook func(int, uint64) error, p int, seq uint64) error {
	if hook == nil {
		return nil
	}
	if err := hook(p, seq); err != nil {
		return &faultError{err}
	}
	return nil
}

// Reconciler is the loop that drives the pure fold over JetStream
// (DESIGN.md §7): for each partition it owns, it reads the partition's
// input events in stream order from its snapshot, folds each into its
// node's state, publishes the effects with their deterministic ids,
// and checkpoints the states once every effect they caused is
// acknowledged.
//
// Exactly once (DESIGN.md §3, §5.3): an effect whose cause is at or before
// the stream's last sequence when the partition's session started may
// have been published by an earlier run. Such effects are deferred while
// the session reads the rest of that range: the partition's own effect
// messages come along in the read, and an effect is dropped when its id is
// seen, or, for a plan, when a later plan of the node is seen (a
// superseded plan is never published after a newer one). Once the read
// passes the start sequence, what is left is published, in order, with
// Nats-Expected-Last-Subject-Sequence set to the subject's last sequence,
// which also fences off a second reconciler still publishing for the
// node. Before that a checkpoint is written only where every effect
// deferred so far was seen stored (at most every
// RecoveryCheckpointInterval), so that a successor resuming from it has
// nothing of the recovery to carry. Later effects are published
// asynchronously with their Nats-Msg-Id, and a checkpoint waits for all
// their acks. A publish left unanswered (the client's server lost, a
// leader election) is sent again with its message id and fence for up to
// electionRideOut (pubride.go: an unfenced live effect only within half
// the dedup window of its first send); a failed publish (a conflict) ends
// the session: the partition restarts from its snapshot and the same rule
// decides again.
//
// Ownership: with [ReconcilerConfig.Grants], a partition is folded only
// while its grant holds. Every publish and every snapshot write first
// checks that the grant is neither revoked as lost nor past its lease's
// local deadline (Grant.Valid); snapshot writes of node states are
// conditional on the key's revision the session last saw, so a stale
// former owner can never overwrite a newer state. See
// docs/architecture.md, "Partitioned reconcilers".
type Reconciler struct {
	// electCh is closed, and replaced, when the stream has a new leader
	// (watchLeaders); guarded by electMu.
	electMu sync.Mutex
	electCh chan struct{}

	js jetstream.JetStream
	// writes is the context effects and snapshots are written through
	// (ReconcilerConfig.Writes, else js).
	writes jetstream.JetStream
	stream jetstream.Stream
	snaps  *store.Snapshots
	// replicated: the stream has more than one replica (and the snapshot
	// bucket, made with the stream's count), so that a leader lost is
	// replaced by an election. Not replicated, a stopping partition rides
	// out none (noRideOut). The bucket's own count is not asked for: its
	// stream's info, asked right after its creation on a cluster, was not
	// found yet (10059) and failed NewReconciler.
	replicated bool
	key        []byte // signs effect message ids: see store.EffectMsgID
	pub        *store.Publisher
	cfg        ReconcilerConfig
	subj       events.Subjects
	log        *slog.Logger
	tr         trace.Tracer // nil: tracing off
	m          *Metrics
	static     []int // the fixed partitions, when cfg.Grants is nil

	mu    sync.RWMutex // guards parts
	parts map[int]*partition

	fleet fleetJournal
	heap  *heapRelease
	tails *tailGate
	// passes are the slots of the restart passes reading at once
	// (ReconcilerConfig.RestPasses).
	passes chan struct{}
	first  *firstLoads

	unsavedMu  sync.Mutex
	unsavedErr map[int]error // see Unsaved

	// downs are the lease keys whose agent or prov down this instance's
	// partitions folded, for its agent liveness watch (foldedDowns).
	downs foldedDowns
}

// publishOpts are the options an effect is published with: its message
// id, and its signature for a plan or a knock.
func (r *Reconciler) publishOpts(e reconcile.Effect, id string, more ...store.AppendOpt) []store.AppendOpt {
	opts := append([]store.AppendOpt{store.WithMsgID(id)}, more...)
	if r.cfg.Signer != nil && (e.Kind == events.KindPlan || e.Kind == events.KindKnock) {
		opts = append(opts, store.WithSigner(r.cfg.Signer))
	}
	return opts
}

// NewReconciler opens the stream and the snapshot bucket. The stream must
// exist: call [EnsureStream] first and pass its effective configuration.
// Create js with jetstream.WithPublishAsyncTimeout (Serve's: 10 s): without
// it, a snapshot put whose answer was lost stays among the client's
// pending publishes for good. The effects go through the reconciler's own
// asynchronous publisher (store.Publisher), whose answers are awaited at
// most publishAsyncTimeout whatever js says (the session sends an effect
// again after ackTimeout either way), at most 4,000 pending
// (store.DefaultMaxPending) beside js's own limit for the puts.
//
// Errors: ErrNoStream when the stream is missing; a partition out of range;
// the snapshot bucket's errors.
func NewReconciler(ctx context.Context, js jetstream.JetStream, cfg ReconcilerConfig) (*Reconciler, error) {
	return newReconciler(ctx, js, cfg, nil)
}

// newReconciler is NewReconciler; a non-nil stream is the stream
// already looked up (Serve's, from EnsureStream), not asked for again.
func newReconciler(ctx context.Context, js jetstream.JetStream, cfg ReconcilerConfig, opened jetstream.Stream) (*Reconciler, error) {
	cfg.Stream = cfg.Stream.WithDefaults()
	if cfg.SnapshotEvery <= 0 {
		cfg.SnapshotEvery = DefaultSnapshotEvery
	}
	if cfg.SnapshotInterval <= 0 {
		cfg.SnapshotInterval = DefaultSnapshotInterval
	}
	if cfg.RecoveryCheckpointInterval <= 0 {
		cfg.RecoveryCheckpointInterval = max(DefaultRecoveryCheckpointInterval, cfg.SnapshotInterval)
	}
	if cfg.FleetJournalEvery <= 0 {
		cfg.FleetJournalEvery = FleetJournalEvery
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	var stream jetstream.Stream
	var scfg store.StreamConfig
	var snaps *store.Snapshots
	var key []byte
	var keyErr error // the key came from the snapshot bucket: see store.ErrKeysDenied
	err := retryTransientEach(ctx, startRetryFor, func(ctx context.Context) (err error) {
		if opened != nil {
			stream = opened
			if scfg, err = store.OpenedStream(opened, cfg.Stream); err != nil {
				return err
			}
		} else if stream, scfg, err = store.OpenStream(ctx, js, cfg.Stream); err != nil {
			return err
		}
		if snaps, err = store.OpenSnapshots(ctx, js, scfg); err != nil {
			return err
		}
		key, err = store.EffectKey(ctx, js, scfg, snaps)
		if errors.Is(err, store.ErrKeysDenied) && key != nil {
			keyErr, err = err, nil
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if keyErr != nil {
		cfg.Logger.Warn("effect-id key read from the snapshot bucket: issue the reconciler's credentials anew so that it may use its own bucket; until then, deleting the snapshot bucket republishes every effect",
			"err", keyErr)
	}
	cfg.Stream = scfg
	if cfg.Signer != nil && cfg.Own == nil {
		if cfg.Own, err = store.NewTrust(cfg.Signer.PublicKey()); err != nil {
			return nil, err
		}
	}
	writes := js
	if cfg.Writes != nil {
		writes = cfg.Writes
		snaps.PublishOn(writes)
	}
	r := &Reconciler{electCh: make(chan struct{}), js: js, writes: writes, stream: stream, snaps: snaps, key: key, pub: store.NewPublisher(writes, scfg.Subjects(),
		store.WithAckTimeout(publishAsyncTimeout), store.WithMaxPending(cfg.tuning.publishPending)),
		replicated: stream.CachedInfo().Config.Replicas > 1 || scfg.Replicas > 1,
		cfg:        cfg, subj: scfg.Subjects(), log: cfg.Logger, tr: tracing.Tracer(cfg.Tracing), m: cfg.Metrics, parts: map[int]*partition{},
		heap: newHeapRelease(cfg.Metrics.HeapReleases), tails: newTailGate(), passes: make(chan struct{}, restPasses(cfg.RestPasses)), first: newFirstLoads()}
	// The snapshot puts go out beside the effects, through the same
	// asynchronous publisher (its pending limit and ack timeout).
	snaps.PublishThrough(r.pub)
	if cfg.Grants != nil {
		return r, nil
	}
	ids := cfg.Assigned
	if ids == nil {
		for p := range scfg.Partitions {
			ids = append(ids, p)
		}
	}
	seen := map[int]bool{}
	for _, p := range ids {
		if p < 0 || p >= scfg.Partitions {
			return nil, fmt.Errorf("partition %d: the stream has partitions 0..%d", p, scfg.Partitions-1)
		}
		if !seen[p] {
			seen[p] = true
			r.static = append(r.static, p)
		}
	}
	return r, nil
}

// startRetryFor bounds how long NewReconciler retries transient failures:
// a freshly formed cluster answers "no response from stream" until its
// stream and bucket leaders are elected (issue 12, item 7).
const startRetryFor = 30 * time.Second

// retryTransient runs op, each attempt bounded by ackTimeout, until it
// succeeds, fails for a reason that is neither store.Transient nor
// store.NoPeersYet, ctx is done or startRetryFor has passed. Each
// failure asked again is noted (store.NoteWait: a start says once what
// it waits for).
//
// store.NoPeersYet is asked again as the store's bucket opens ask it: a
// replicated bucket's creation (the effect key's, the lease bucket's)
// on a cluster whose meta leader is back before its other servers is
// answered "no suitable peers for placement" (10005) until they are.
// Taken for final, it ended a reconciler started on a fresh cluster
// 3.6 s after a quorum was back (TestServeWaitsForAFreshClustersLeaders
// under load), while the cluster was still coming up.
func retryTransient(ctx context.Context, op func(ctx context.Context) error) error {
	return retryTransientEach(ctx, ackTimeout, op)
}

// retryTransientEach is retryTransient whose attempts are each bounded by
// each: startRetryFor for the opens of the stream and the buckets, which
// ask again inside while unanswered (store.AskAgain) and so ride out an
// election, or a loaded cluster slower than ackTimeout, within the 30 s
// operations.md promises for each. Bounded by ackTimeout, the snapshot
// bucket's open ended a start at load ~50 ("stream KV_MESH_SNAPSHOTS did
// not answer within 5s").
func retryTransientEach(ctx context.Context, each time.Duration, op func(ctx context.Context) error) error {
	deadline := time.Now().Add(startRetryFor)
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(2*time.Second), backoff.WithMaxElapsedTime(0))
	for {
		actx, cancel := context.WithTimeout(ctx, each)
		err := op(actx)
		cancel()
		again := store.Transient(err) || store.NoPeersYet(err)
		if err == nil || !again || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		store.NoteWait(ctx, err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(b.NextBackOff()):
		}
	}
}

// Stream returns the effective stream configuration.
func (r *Reconciler) Stream() store.StreamConfig { return r.cfg.Stream }

// Run folds the owned partitions until ctx is done, then stops gracefully:
// it finishes the event in hand, waits for its effects' acknowledgements,
// writes the snapshot and returns nil. A partition whose session fails
// (a lost connection, a failed publish, a snapshot write conflict)
// restarts from its snapshot with backoff; only a fault hook's error ends
// Run early.
//
// With [ReconcilerConfig.Grants], Run starts a partition when its grant
// arrives and stops it when the grant is revoked: gracefully (as above)
// for [ErrReleased], at once and writing nothing more for any other cause
// ([ErrLeaseLost]). Each grant's Stopped is called once its partition has
// stopped. A grant for a partition out of range, or for one already
// running, is a bug of the grant's source: Run stops and returns an error.
func (r *Reconciler) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.fleetLoop(ctx)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.watchLeaders(ctx)
	}()
	start := func(g Grant) error {
		p, err := r.addPartition(g)
		if err != nil {
			if g.Stopped != nil {
				g.Stopped()
			}
			return err
		}
		p.loaded = r.first.add()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer p.loaded() // ended before its first load did
			err := p.run(ctx)
			r.dropPartition(p)
			if g.Stopped != nil {
				g.Stopped()
			}
			if err != nil {
				select {
				case errs <- fmt.Errorf("partition %d: %w", p.id, err):
				default:
				}
				cancel()
			}
		}()
		return nil
	}
	var fatal error
	if r.cfg.Grants == nil {
		for _, id := range r.static {
			if err := start(Grant{Partition: id}); err != nil {
				fatal = err
				cancel()
				break
			}
		}
		r.first.start()
	} else {
		r.first.start()
		grants := r.cfg.Grants
	loop:
		for {
			select {
			case g, ok := <-grants:
				if !ok {
					grants = nil
					continue
				}
				if err := start(g); err != nil {
					fatal = err
					cancel()
					break loop
				}
			case <-ctx.Done():
				break loop
			}
		}
	}
	wg.Wait()
	if fatal != nil {
		return fatal
	}
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// addPartition registers the partition of a grant.
func (r *Reconciler) addPartition(g Grant) (*partition, error) {
	n := r.cfg.Stream.Partitions
	if g.Partition < 0 || g.Partition >= n {
		return nil, fmt.Errorf("grant of partition %d: the stream has partitions 0..%d", g.Partition, n-1)
	}
	p := &partition{r: r, id: g.Partition, states: map[string]*reconcile.State{}, revoked: g.Revoked, valid: g.Valid, loaded: func() {}}
	if p.revoked == nil {
		p.revoked = context.Background()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.parts[g.Partition] != nil {
		return nil, fmt.Errorf("grant of partition %d: already folded here", g.Partition)
	}
	r.parts[g.Partition] = p
	r.m.Owned.Set(float64(len(r.parts)))
	return p, nil
}

// dropPartition forgets a stopped partition: its nodes are no longer
// this instance's to answer for.
func (r *Reconciler) dropPartition(p *partition) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.parts[p.id] == p {
		delete(r.parts, p.id)
	}
	r.m.Owned.Set(float64(len(r.parts)))
}

// Owned returns the partitions this instance folds now, sorted.
func (r *Reconciler) Owned() []int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]int, 0, len(r.parts))
	for id := range r.parts {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// Progress returns, for each partition this instance owns, the last
// stream sequence of that partition it has read and folded (0 before the
// first). Effects of those events may still await their acks, and the
// snapshot may be older: see the checkpoints for what is durable.
func (r *Reconciler) Progress() map[int]uint64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make(map[int]uint64, len(r.parts))
	for id, p := range r.parts {
		out[id] = p.folded.Load()
	}
	return out
}

// Node returns a deep copy of node's folded state, or false when this
// instance folds no state for it (not its partition, or no event yet).
func (r *Reconciler) Node(node string) (*reconcile.State, bool) {
	r.mu.RLock()
	p := r.parts[r.subj.Partition(node)]
	r.mu.RUnlock()
	if p == nil {
		return nil, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.states[node]
	if st == nil {
		return nil, false
	}
	return st.Clone(), true
}

// Unknown reports whether this instance folds node's partition, has read
// every state of it, and holds none of node: a node it has folded no
// event of (one whose events are still to be folded is unknown too, as
// Node says). False when the partition is not this instance's, or its
// states are still being read (a restart's lazy session): another
// instance, or a later ask, may know it. The state service of a group
// answers such a node "unknown" at once instead of leaving the client
// to its timeout (StateServiceConfig.Unknown; a fresh user's finding:
// an apply of 185 new nodes waited 2.4 s for each, one after another).
func (r *Reconciler) Unknown(node string) bool {
	r.mu.RLock()
	p := r.parts[r.subj.Partition(node)]
	r.mu.RUnlock()
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.complete && p.states[node] == nil
}

// partitionsHeld returns the partitions this instance holds now, copied
// under r.mu so that a caller may lock each partition without holding it.
func (r *Reconciler) partitionsHeld() []*partition {
	r.mu.RLock()
	defer r.mu.RUnlock()
	parts := make([]*partition, 0, len(r.parts))
	for _, p := range r.parts {
		parts = append(parts, p)
	}
	return parts
}

// Nodes returns the names of the nodes whose states this instance holds.
func (r *Reconciler) Nodes() []string {
	parts := r.partitionsHeld()
	var out []string
	for _, p := range parts {
		p.mu.Lock()
		for n := range p.states {
			out = append(out, n)
		}
		p.mu.Unlock()
	}
	slices.Sort(out)
	return out
}

// partition is one partition's fold: its node states, replaced at each
// session start from the snapshot.
type partition struct {
	r  *Reconciler
	id int
	// revoked is the grant's: done when the partition is no longer this
	// instance's (never, for a fixed partition); valid its lease's local
	// deadline check (nil: always valid).
	revoked context.Context
	valid   func() bool

	mu     sync.Mutex // guards states, complete, and each state while it folds
	states map[string]*reconcile.State
	// complete says states holds every state the partition's snapshots
	// hold (no lazy session's pass over the rest still to merge): a
	// node missing from it has no state here (Reconciler.Unknown).
	complete bool
	// folded is the last sequence of the partition read and folded.
	folded atomic.Uint64
	// loaded marks the partition's first load over (Reconciler.first).
	loaded func()
	// stopping is closed once the partition stops (Run's ctx ended, or
	// its grant was revoked): its final snapshot is being written. Nil
	// (never) for a partition built outside run.
	stopping <-chan struct{}
}

// lost returns an error wrapping [ErrLeaseLost] once the partition may
// no longer be written by this instance: its grant was revoked for any
// cause but [ErrReleased], or its lease's local deadline has passed. A
// released partition is still its own until it has stopped: it writes its
// final snapshot.
func (p *partition) lost() error {
	if p.revoked.Err() != nil {
		cause := context.Cause(p.revoked)
		if !errors.Is(cause, ErrReleased) {
			if errors.Is(cause, ErrLeaseLost) {
				return cause
			}
			return fmt.Errorf("%w: %v", ErrLeaseLost, cause)
		}
	}
	if p.valid != nil && !p.valid() {
		return fmt.Errorf("%w: its lease was not renewed in time", ErrLeaseLost)
	}
	return nil
}

func (p *partition) run(ctx context.Context) error {
	// The partition stops when Run's ctx is done or its grant revoked.
	// Only the first is the reconciler's stop: Unsaved reports what that
	// stop did not write, not a partition given up while Run went on.
	runCtx := ctx
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	defer context.AfterFunc(p.revoked, stop)()
	p.stopping = ctx.Done()
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(2*time.Second), backoff.WithMaxElapsedTime(0))
	for {
		started := time.Now()
		err := p.session(ctx)
		var fe *faultError
		switch {
		case errors.As(err, &fe):
			return err
		case ctx.Err() != nil:
			// The final snapshot is written with a context of its own: a
			// cancelled error is a session stopped while it started,
			// which had nothing past its snapshot to write.
			if err != nil && !errors.Is(err, context.Canceled) {
				p.unsaved(runCtx, err) // the final snapshot failed
			}
			return nil
		case errors.Is(err, ErrLeaseLost):
			// Past the lease's deadline: its revocation follows.
			p.r.log.Warn("partition lease lost; stopped", "partition", p.id, "err", err)
			<-ctx.Done()
			p.unsaved(runCtx, err)
			return nil
		}
		if time.Since(started) > time.Minute {
			b.Reset()
		}
		wait := b.NextBackOff()
		if p.r.awaitLeaders(ctx) {
			// A leader election ended the session: restart as soon as
			// the leaders are back, not after a backoff that grew while
			// every attempt failed (issue 24).
			b.Reset()
			wait = 0
		}
		p.r.log.Warn("partition session ended; restarting from its snapshot", "partition", p.id, "err", err, "in", wait)
		p.r.m.Restarts.Inc()
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			p.unsaved(runCtx, err)
			return nil
		}
	}
}

// unsaved records that the partition stopped without writing its final
// snapshot, for [Reconciler.Unsaved], when it stopped because Run's ctx
// (runCtx) ended. A partition stopped while Run went on (its lease lost
// or handed over, as while the NATS servers restart one by one) is not
// the stop's to report: the group logged the loss as it came, and a
// later grant of the same partition may well write its snapshot at the
// stop (docs/architecture.md, "A stop reports the partitions it held").
func (p *partition) unsaved(runCtx context.Context, err error) {
	if runCtx.Err() == nil {
		p.r.log.Info("partition stopped without its last snapshot; its next owner refolds from the previous one",
			"partition", p.id, "err", err)
		return
	}
	p.r.unsaved(p.id, err)
}

// unsaved records that partition p stopped without writing its final
// snapshot, and why.
func (r *Reconciler) unsaved(p int, err error) {
	r.unsavedMu.Lock()
	defer r.unsavedMu.Unlock()
	if r.unsavedErr == nil {
		r.unsavedErr = map[int]error{}
	}
	r.unsavedErr[p] = err
}

// Unsaved returns the partitions whose final snapshot the last Run did
// not write as it stopped (a failed write, a lease lost, a session that
// had failed), and why; empty after a clean stop. Partitions that stopped
// earlier, while Run went on (a lease lost or handed over), are not in it:
// they were not this instance's at the stop. A restart refolds those partitions from
// their previous snapshot: nothing is lost, but "snapshots written" would
// not be true.
func (r *Reconciler) Unsaved() map[int]error {
	r.unsavedMu.Lock()
	defer r.unsavedMu.Unlock()
	return maps.Clone(r.unsavedErr)
}
