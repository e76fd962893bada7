package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	rtrace "runtime/trace"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/tracing"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
)

// pendingAck is an effect sent and not yet acknowledged.
type pendingAck struct {
	f    jetstream.PubAckFuture
	sent time.Time
	e    reconcile.Effect
	// ok and errc, when set, stand for f's channels: a traced publish's
	// span ends when its ack arrives (relayAck), and a future's ack is
	// delivered once.
	ok   <-chan *jetstream.PubAck
	errc <-chan error
	// resent: f is a copy sent again by awaitAcks, an earlier send (the
	// first always went out) unanswered. A duplicate answer is then the
	// copy that send stored: the effect counts as published once, as a
	// first send's acknowledgement does (sends).
	resent bool
}

// acked returns the channels the ack or the error of pa arrives on.
func (pa pendingAck) acked() (<-chan *jetstream.PubAck, <-chan error) {
	if pa.ok != nil {
		return pa.ok, pa.errc
	}
	return pa.f.Ok(), pa.f.Err()
}

// relayAck ends span when f's ack (or error) arrives, noting the stored
// sequence, and passes the ack on through the returned channels; when
// ctx (the session's) ends first, it ends span and passes nothing.
func relayAck(ctx context.Context, f jetstream.PubAckFuture, span trace.Span) (<-chan *jetstream.PubAck, <-chan error) {
	ok, errc := make(chan *jetstream.PubAck, 1), make(chan error, 1)
	go func() {
		defer span.End()
		select {
		case a := <-f.Ok():
			span.SetAttributes(tracing.SeqAttr(tracing.Seq, a.Sequence), attribute.Bool("meshfold.duplicate", a.Duplicate))
			ok <- a
		case err := <-f.Err():
			span.SetStatus(codes.Error, err.Error())
			errc <- err
		case <-ctx.Done():
			span.SetStatus(codes.Error, "session ended before the acknowledgement")
		}
	}()
	return ok, errc
}

// session is one run of a partition from its snapshot.
type session struct {
	p           *partition
	checkpoint  uint64 // the sequence the stored snapshot covers
	ckRev       uint64 // the checkpoint key's revision, as last seen (putCheckpoint)
	folded      uint64 // the last sequence read and folded (or skipped)
	lastAtStart uint64 // the stream's last sequence when the session began
	// recovering holds while the read has not passed lastAtStart: effects
	// are deferred in rec, to be dropped if seen stored, and a checkpoint
	// is written only where every effect deferred so far was seen stored
	// (recoveryCheckpointDue).
	recovering bool
	rec        *recovery
	// rt traces the recovery (nil: tracing off, or not recovering).
	rt *recoveryTrace
	// early, while a first refold recovers (a read from the stream's
	// first message, no effect of the partition stored), publishes its
	// effects during the read (nil: every effect is deferred in rec).
	early *earlyPub
	// held is a read from the stream's first message asking whether
	// the stream holds effects of the partition (askHoldsEffects), until
	// consume takes its answer (takeHeld): nil once taken, or never
	// asked.
	held *heldAsk
	// made is the read's consumer made at the session's start, beside
	// its other reads (a session without a checkpoint: madeFollow), until
	// consume takes it; nil once taken, or never made.
	made *madeFollow
	// checkpointed is when the session last wrote a checkpoint, or began.
	checkpointed time.Time
	// readAll holds when the read began at or before the stream's first
	// message: every stored message of the partition up to the read's
	// position is seen.
	readAll bool
	// dirty holds the nodes folded since their state was last put, each
	// with the first such event and the checkpoint generation it came in
	// (see checkpointNow).
	dirty map[string]dirtyNode
	// gen counts the session's checkpoints.
	gen uint64
	// stateAvg is the average size of the states the last checkpoint
	// encoded, in bytes: what the next one's buffer reserves a state.
	stateAvg int
	revs     map[string]uint64 // each node key's snapshot revision, as last seen
	pending  []pendingAck
	// since counts the events folded since the last checkpoint was
	// taken (captureCheckpoint).
	since int
	// writing is the live checkpoint being written while the fold goes
	// on (checkpointLive), nil when none is; due notes a checkpoint that
	// came due meanwhile, dueFull that it puts every changed state.
	writing      *checkpointWrite
	due, dueFull bool
	in           *interner
	// tooBig holds the nodes whose snapshot is a marker (their state is
	// over the server's max_payload): journaled once.
	tooBig map[string]bool
	// The metrics of the fold's path, resolved once: a labelled metric's
	// lookup hashes its labels, on every event (issue 17).
	lag     prometheus.Gauge
	counted map[events.Kind]prometheus.Counter
	// n counts the messages the session handled; the fold's duration is
	// observed for one in foldSample. tickN is n at the last snapshot
	// tick, and idleTicks how many ticks in a row have found it unmoved
	// since the last ask: a recovery that handled nothing for
	// recoveryIdleAfter asks the leader whether its end is still to come
	// (recoveryIdle).
	n, tickN  uint64
	idleTicks int
	// quietN is n when the read was last seen delivering (readStalled),
	// and quietSince since when it has not. stallAfter, when set, is how
	// quiet the read may be before its consumer is asked, in place of
	// readStallAfter, until it delivers or is asked: a new stream
	// leader's check found its consumer holding input (readGone).
	quietN     uint64
	quietSince time.Time
	stallAfter time.Duration
	// turns counts the snapshot ticks the loop took, and step names the
	// step the session waits in, if any (enter): what watchTurns reads
	// from a goroutine of its own.
	turns atomic.Uint64
	step  atomic.Pointer[string]
	// lazy holds while the session reads a node's state from its
	// snapshot at the node's first event (fetch), until the pass over
	// the others (rest) is merged: see shortTail.
	lazy bool
	// rest is the pass over the states a lazy session's tail did not
	// name, running beside the fold (startRest); nil when none runs.
	rest *restPass
	// ctx is the session's own context (consume's ctx), which the pass
	// runs under: the fold's work context outlives a stop request.
	ctx context.Context
	// endTail marks a lazy session's tail refolded (Reconciler.tails).
	endTail func()
	// began is when the session started; fetches and fetchTook count a
	// lazy session's reads by key and their time: the debug log's
	// account of a restart's refold (caughtUp).
	began     time.Time
	fetches   int
	fetchTook time.Duration
	followed  time.Duration // from began to the read's consumer made
	// endLoad marks the session's load (its snapshots and the refold of
	// its tail) over: see heapRelease.
	endLoad func()
	// mine holds the plan messages this session published and has not
	// read back yet, by message id (at most mineCap; nil when the
	// reconciler does not sign, or its own key is not in Own).
	mine map[string]minePlan
}

// minePlan is a plan message a session published, as it signed it.
type minePlan struct {
	node              string
	data              []byte
	signer, signature string
}

// mineCap bounds the plans a session remembers between publishing and
// reading them back (a plan is ~1 KB).
const mineCap = 4096

// remember notes a plan message the session published: read back
// byte-for-byte (node, payload, message id, signer and signature), it is
// the plan this reconciler signed, and its signature needs no check.
// Ed25519 signatures are deterministic, so the stored copy of a plan this
// process signed carries exactly these bytes; verifying one took 48 µs,
// more than the rest of its fold, and a reconciler reads back each plan
// it publishes (issue 17).
func (s *session) remember(m *nats.Msg) {
	if s.mine == nil || len(s.mine) >= mineCap || m == nil {
		return
	}
	node, kind, err := s.p.r.subj.Parse(m.Subject)
	if err != nil || kind != events.KindPlan {
		return
	}
	s.mine[m.Header.Get(jetstream.MsgIDHeader)] = minePlan{node: node, data: m.Data,
		signer: m.Header.Get(store.HeaderSigner), signature: m.Header.Get(store.HeaderSignature)}
}

// ownRead reports whether msg, a plan of node as the stream stored it
// (under its partition's subject), is one this session published and
// remembered, byte-for-byte, and forgets it.
func (s *session) ownRead(node string, msg jetstream.Msg) bool {
	if len(s.mine) == 0 {
		return false
	}
	h := msg.Headers()
	id := h.Get(jetstream.MsgIDHeader)
	m, ok := s.mine[id]
	if !ok {
		return false
	}
	delete(s.mine, id)
	return m.node == node && bytes.Equal(m.data, msg.Data()) &&
		m.signer == h.Get(store.HeaderSigner) && m.signature == h.Get(store.HeaderSignature)
}

// ownStored reports whether msg, a plan of node read while recovering
// whose keyed message id carries effect id id, is the plan this
// session's fold deferred under that id and has not seen stored yet,
// byte-for-byte, signed (by its header) with this reconciler's current
// key, which its own keys trust and do not retire: a plan it published
// itself before a crash or a refold, folded
// without checking its signature (docs/architecture.md, "Own plans
// recognised by their keyed id").
func (s *session) ownStored(node, id string, msg jetstream.Msg) bool {
	signer, own := s.p.r.cfg.Signer, s.p.r.cfg.Own
	if signer == nil || !own.Trusts(signer.PublicKey()) || own.Retired(signer.PublicKey()) ||
		msg.Headers().Get(store.HeaderSigner) != signer.PublicKey() {
		return false
	}
	e, ok := s.rec.unstoredPlan(node, id)
	if !ok {
		return false
	}
	data, err := events.Encode(e.Payload)
	return err == nil && bytes.Equal(data, msg.Data())
}

// foldSample: the fold's duration (meshfold_fold_seconds) is observed for
// one message in foldSample. Two clock reads and a histogram update a
// message were ~5 % of a catch-up's CPU (issue 17); a sample of one in
// 16 keeps the distribution.
const foldSample = 16

// foldedCounter returns the folded-events counter of kind.
func (s *session) foldedCounter(kind events.Kind) prometheus.Counter {
	c, ok := s.counted[kind]
	if !ok {
		c = s.p.r.m.Folded.WithLabelValues(string(kind))
		s.counted[kind] = c
	}
	return c
}

func (p *partition) session(ctx context.Context) error {
	r := p.r
	began := time.Now()
	// The checkpoint key's revision, which the session's checkpoint puts
	// are fenced on (putCheckpoint): read before the states, so that a
	// former session's put landing meanwhile is seen as a conflict.
	// Leader reads, here and below, ride out an election (leaderRead).
	// shortTail decides from the sequence read with it (one read of the
	// key, not two: issue 27, a cold refold's fixed costs).
	var ckAt, ckRev uint64
	if err := p.leaderRead(ctx, func(ctx context.Context) (err error) {
		ckAt, ckRev, err = r.snaps.CheckpointRev(ctx, p.id)
		return err
	}); err != nil {
		return err
	}
	// The stream's bounds are read once, after the checkpoint (issue 27:
	// shortTail and the session's start each read them, two round trips
	// of every session's start): what shortTail decides from, and the
	// session's start (lastAtStart, readAll). Without a checkpoint the
	// session reads every state before its refold whatever the bounds
	// say, so that read goes at once, beside theirs.
	var first, last uint64
	bounds := func(ctx context.Context) error {
		return p.leaderRead(ctx, func(ctx context.Context) (err error) {
			first, last, err = store.StreamBounds(ctx, r.stream)
			return err
		})
	}
	in := newInterner()
	var (
		revs   map[string]uint64
		states = map[string]*reconcile.State{}
		tooBig = map[string]bool{}
		lazy   bool
	)
	load := func(ctx context.Context) (err error) {
		_, revs, err = p.loadStates(ctx, in, states, tooBig, nil, ckAt)
		return err
	}
	// held: whether the stream holds effects of the partition, asked
	// when the session starts from the stream's first message with input
	// to refold (askHoldsEffects), beside its consumer's creation. Where
	// events aged out of the stream before they were folded, it is asked
	// after the fleet journal's entry saying so (agedOut, below), as it
	// was: that entry may be one of the partition's effects.
	var (
		made *madeFollow
		held *heldAsk
	)
	asksHeld := func() bool { return last > ckAt && ckAt < first && !(first > ckAt+1 && last >= first) }
	defer func() {
		made.drop()
		if held != nil {
			held.stop()
		}
	}()
	if ckAt == 0 {
		// The read starts at the stream's first message whatever the
		// states hold: its consumer is made (and the held ask sent) once
		// the bounds are read, beside the read of the states, and its
		// messages handled once that is done (consume). The bounds are
		// read before the consumer is made, as when one followed the
		// other: what the consumer holds at its creation (Tail.Empty)
		// is then at least everything up to lastAtStart.
		atBounds := func(bctx context.Context) error {
			if err := bounds(bctx); err != nil {
				return err
			}
			made = p.followAtStart(ctx, 1)
			if asksHeld() {
				held = p.askHoldsEffects(ctx)
			}
			return nil
		}
		if err := both(ctx, atBounds, load); err != nil {
			return err
		}
	} else {
		if err := bounds(ctx); err != nil {
			return err
		}
		var err error
		if lazy, err = p.shortTail(ctx, ckAt, last); err != nil {
			return err
		}
	}
	// The load is a burst of garbage: once every partition loading has
	// caught up (or ended), the heap it freed goes back to the system. A
	// cold refold (no checkpoint, a stream to fold from its start)
	// raises the collector's percent while it lasts.
	endHeap := r.heap.begin(ckAt == 0 && last > 0)
	endLoad := func() {
		endHeap()
		p.loaded()
	}
	defer endLoad()
	ck := ckAt
	endTail := func() {}
	if lazy {
		// Only the states the tail's events name are read before the
		// refold (session.fetch), every other one once it is done
		// (session.startRest, beside the fold): a restart's refold is then
		// O(tail).
		endTail = r.tails.begin()
		defer endTail()
		revs = map[string]uint64{}
	} else if ckAt != 0 {
		if err := load(ctx); err != nil {
			return err
		}
	}
	p.mu.Lock()
	p.states = states
	// A lazy session holds only its tail's states until its pass over
	// the rest is merged (mergeRest); until then a miss is no answer.
	p.complete = !lazy
	p.mu.Unlock()
	s := &session{p: p, made: made, checkpoint: ck, ckRev: ckRev, folded: ck, lastAtStart: last, recovering: last > ck, readAll: ck < first, in: in,
		rec: newRecovery(), checkpointed: time.Now(), dirty: map[string]dirtyNode{}, revs: revs, tooBig: tooBig,
		lag: r.m.Lag.WithLabelValues(strconv.Itoa(p.id)), counted: map[events.Kind]prometheus.Counter{}, endLoad: endLoad, lazy: lazy, endTail: endTail, began: began}
	if r.cfg.Signer != nil && r.cfg.Own.Trusts(r.cfg.Signer.PublicKey()) {
		s.mine = map[string]minePlan{}
	}
	if s.recovering {
		s.rt = newRecoveryTrace(r.tr, p.id, began, ck, last)
	}
	p.folded.Store(ck)
	if first > ck+1 && last >= first {
		// Events past the checkpoint were removed before they were
		// folded: say so, once, and checkpoint past the gap.
		r.agedOut(ctx, p.id, ck, first)
		s.folded = first - 1
	}
	if held != nil {
		s.held = held
	} else if s.recovering && s.readAll {
		// Asked beside the consumer's creation, taken before the first
		// message is handled (consume, takeHeld).
		s.held = p.askHoldsEffects(ctx)
		defer s.held.stop()
	}
	r.log.Debug("partition session", "partition", p.id, "checkpoint", ck, "nodes", len(states), "stream_last", last)
	err := s.consume(ctx)
	if s.recovering {
		why := err
		if why == nil {
			why = errSessionStopped
		}
		s.rt.end(0, why)
	}
	return err
}

// lazyTail is how many times the messages the snapshot bucket holds must
// outnumber the stream's messages past a partition's checkpoint for its
// session to read only the states its tail names before refolding it:
// such a read is a round trip, while the pass over every state costs a
// fraction of one a state.
const lazyTail = 4

// shortTail reports whether the partition's session should refold its
// tail before reading every state (issue 27), ck being its checkpoint
// (not 0) and last the stream's last sequence, as just read: the
// stream's messages past the checkpoint, times lazyTail, are at most the
// messages of the snapshot bucket (one a node, all partitions: the
// partition's share of both is about the same). A restart at 100,000
// nodes read every state of its partitions before the first event of a
// tail of a few hundred, 15 s; the restart at 10,000 nodes took 1.6 s.
func (p *partition) shortTail(ctx context.Context, ck, last uint64) (bool, error) {
	if last <= ck {
		return false, nil
	}
	stored, err := p.r.snaps.Stored(ctx)
	if err != nil {
		return false, err
	}
	return (last-ck)*lazyTail <= stored, nil
}

// readCheckpoint asks loadStates to read the checkpoint itself.
const readCheckpoint = ^uint64(0)

// both runs a and b at once and returns the first error of the two,
// once both have ended; the first error ends the other's context.
func both(ctx context.Context, a, b func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		first error
	)
	run := func(f func(context.Context) error) {
		if err := f(ctx); err != nil {
			mu.Lock()
			if first == nil {
				first = err
			}
			mu.Unlock()
			cancel()
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { run(b) })
	run(a)
	wg.Wait()
	return first
}

// loadStates reads every node state of the partition's snapshots but
// those skip names (nil: none) into states, decoding each as the pass
// reads it (the raw snapshots of a partition are never all held at
// once); a node whose snapshot is a marker or of a newer format is
// refolded from the stream, up to the checkpoint, the markers' nodes
// noted in tooBig. ck is the checkpoint the caller read before the call
// (a session's start: CheckpointRev), or readCheckpoint to read it
// first (the pass beside a lazy session's fold, whose session may have
// checkpointed since it started). It returns the checkpoint and the
// revision of every node key (store.Snapshots.ScanPartitionStates).
func (p *partition) loadStates(ctx context.Context, in *interner, states map[string]*reconcile.State, tooBig map[string]bool,
	skip func(node string) bool, ck uint64) (uint64, map[string]uint64, error) {
	r := p.r
	var markers, newer []string
	if ck == readCheckpoint {
		var err error
		if ck, err = r.snaps.Checkpoint(ctx, p.id); err != nil {
			return 0, nil, err
		}
	}
	revs, err := r.snaps.ScanPartitionStates(ctx, p.id, func(node string, b []byte) error {
		if skip != nil && skip(node) {
			return nil
		}
		if _, ok := markerOf(b); ok {
			markers = append(markers, node)
			delete(states, node)
			return nil
		}
		st, err := reconcile.UnmarshalState(b)
		if errors.Is(err, reconcile.ErrSnapshotNewer) {
			// A newer build wrote it (this one was rolled back): its
			// fields may mean what this build does not know. Refold the
			// node from the stream, as for a marker.
			r.log.Error("node snapshot written by a newer build: refolding the node from the stream", "node", node, "err", err)
			newer = append(newer, node)
			delete(states, node)
			return nil
		}
		if err != nil {
			return fmt.Errorf("snapshot of node %s: %w", node, err)
		}
		in.state(st)
		states[node] = st
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	for _, node := range slices.Concat(markers, newer) {
		if states[node] != nil {
			continue // written again during the pass, as a state
		}
		marker := slices.Contains(markers, node)
		st, err := p.refoldSnapshot(ctx, in, node, marker, ck)
		if err != nil {
			return 0, nil, err
		}
		if marker {
			tooBig[node] = true
		}
		states[node] = st
	}
	return ck, revs, nil
}

// refoldSnapshot folds node from the stream up to upTo, its snapshot
// being a marker (too big) or of a newer format, and interns the state.
func (p *partition) refoldSnapshot(ctx context.Context, in *interner, node string, marker bool, upTo uint64) (*reconcile.State, error) {
	st, err := p.refoldNode(ctx, node, upTo)
	if err != nil {
		return nil, err
	}
	if marker {
		p.r.log.Info("node state refolded from the stream: its snapshot is a marker", "node", node, "seq", st.Seq)
	} else {
		p.r.log.Info("node state refolded from the stream: its snapshot is of a newer format", "node", node, "seq", st.Seq)
	}
	in.state(st)
	return st, nil
}

// fetch reads node's state from its snapshot before a lazy session folds
// the node's first event of the tail, unless the session holds it: the
// node has no event past the checkpoint the session folded yet, so its
// snapshot (at or past the checkpoint) is its state. It notes the key's
// revision, for the node's next snapshot put.
func (s *session) fetch(ctx context.Context, node string) error {
	p := s.p
	if p.states[node] != nil {
		return nil // the session goroutine alone writes p.states
	}
	t0 := time.Now()
	b, rev, err := p.r.snaps.NodeAt(ctx, p.id, node)
	s.fetches, s.fetchTook = s.fetches+1, s.fetchTook+time.Since(t0)
	if err != nil {
		return err
	}
	s.revs[node] = rev
	if b == nil {
		return nil // none stored: the fold starts the node's state
	}
	var st *reconcile.State
	if _, ok := markerOf(b); ok {
		if st, err = p.refoldSnapshot(ctx, s.in, node, true, s.checkpoint); err != nil {
			return err
		}
		s.tooBig[node] = true
	} else if st, err = reconcile.UnmarshalState(b); errors.Is(err, reconcile.ErrSnapshotNewer) {
		p.r.log.Error("node snapshot written by a newer build: refolding the node from the stream", "node", node, "err", err)
		if st, err = p.refoldSnapshot(ctx, s.in, node, false, s.checkpoint); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("snapshot of node %s: %w", node, err)
	} else {
		s.in.state(st)
	}
	p.mu.Lock()
	p.states[node] = st
	p.mu.Unlock()
	return nil
}

// restPass is a lazy session's pass over every state its tail did not
// name (startRest), run on a goroutine of its own beside the fold: the
// partition folds new events as soon as its tail is checkpointed, instead
// of after the pass (4–5 s at 100,000 nodes, during which a want waited
// for its plan and a stop for the pass, issue 27). The goroutine writes
// only the pass's own fields, read by the session once done is closed
// (mergeRest); it reads p.states under p.mu, to skip the nodes the
// session already holds. The passes of a process take turns
// (Reconciler.passes, restPasses).
type restPass struct {
	cancel context.CancelFunc
	done   chan struct{}
	in     *interner // the pass's own: the session's is not safe for concurrent use
	states map[string]*reconcile.State
	tooBig map[string]bool
	revs   map[string]uint64
	err    error
	// waited and took: the pass's wait for the tail gate and its slot
	// (Reconciler.passes), and its read of the states after it (the
	// debug log's account, mergeRest).
	waited, took time.Duration
}

// startRest starts the pass over every state the tail did not name, once
// a lazy session's refold is checkpointed (or it had none): it waits for
// every lazy session of the process to end its tail (tailGate) and for
// a slot among the passes reading at once (restPasses), then reads the
// states. ctx is the session's own (not its work context), so
// that a stop, or the partition lost, ends the pass at once; the session
// ends it (stopRest) before it returns in any case. Until the pass is
// merged the session stays lazy: a node it has not read yet is read by
// key at its first event (fetch), never folded from an empty state.
func (s *session) startRest(ctx context.Context) {
	p := s.p
	s.endTail()
	ctx, cancel := context.WithCancel(ctx)
	rp := &restPass{cancel: cancel, done: make(chan struct{}), in: newInterner(),
		states: map[string]*reconcile.State{}, tooBig: map[string]bool{}}
	s.rest = rp
	go func() {
		defer close(rp.done)
		t0 := time.Now()
		if rp.err = p.r.tails.wait(ctx); rp.err != nil {
			return
		}
		// A slot among the passes reading at once (restPasses): a stop
		// ends the wait.
		select {
		case p.r.passes <- struct{}{}:
			defer func() { <-p.r.passes }()
		case <-ctx.Done():
			rp.err = context.Cause(ctx)
			return
		}
		rp.waited = time.Since(t0)
		defer func() { rp.took = time.Since(t0) - rp.waited }()
		if hook := p.r.cfg.Faults.BeforeRest; hook != nil {
			if err := hook(ctx, p.id); err != nil {
				rp.err = &faultError{err}
				return
			}
		}
		held := func(node string) bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			return p.states[node] != nil
		}
		_, rp.revs, rp.err = p.loadStates(ctx, rp.in, rp.states, rp.tooBig, held, readCheckpoint)
	}()
}

// restDone is closed when the pass over the rest of the states has ended;
// nil (never ready) when none runs.
func (s *session) restDone() <-chan struct{} {
	if s.rest == nil {
		return nil
	}
	return s.rest.done
}

// mergeRest takes the ended pass's states into the session, between two
// events, under the rules the pass kept when the session waited for it:
// a node the session holds (fetched and folded since the pass began, or
// before) keeps its state, and the pass's copy is dropped; a key's
// revision is taken only where the session has none (a node it fetched
// has the revision it read, or the one its own put stored); a marker's
// node is noted too big only where its state is the pass's. A pass that
// failed because ctx ended is no error: the session's stop follows.
func (s *session) mergeRest(ctx context.Context) error {
	p, rp := s.p, s.rest
	s.rest = nil
	rp.cancel()
	if rp.err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return rp.err
	}
	p.mu.Lock()
	for node, st := range rp.states {
		if p.states[node] == nil {
			p.states[node] = st
			if rp.tooBig[node] {
				s.tooBig[node] = true
			}
		}
	}
	n := len(p.states)
	p.complete = true
	p.mu.Unlock()
	for node, rev := range rp.revs {
		if _, ok := s.revs[node]; !ok {
			s.revs[node] = rev
		}
	}
	s.in.absorb(rp.in)
	s.lazy = false
	p.r.log.Debug("partition states read after the refold of its tail", "partition", p.id, "nodes", n,
		"fetches", s.fetches, "rest_ms", time.Since(s.began).Milliseconds(), "wait_ms", rp.waited.Milliseconds(), "pass_ms", rp.took.Milliseconds())
	s.endLoad()
	return nil
}

// stopRest ends the pass, if one runs, and waits for its goroutine: a
// session's pass never outlives it.
func (s *session) stopRest() {
	if s.rest == nil {
		return
	}
	s.rest.cancel()
	<-s.rest.done
	s.rest = nil
}

// follow makes the partition's read from sequence from: a consumer of
// the partition's subjects. One wildcard filter over the partition: the
// server serves a single filter from its subject index, while several
// filters (the input kinds alone) made it scan, 30x slower on a long
// stream. Knocks and journal entries come along; the fold only counts
// them as seen.
func (p *partition) follow(ctx context.Context, from uint64) (*store.Tail, error) {
	r := p.r
	if h := r.cfg.Faults.BeforeFollow; h != nil {
		if err := h(p.id, from); err != nil {
			return nil, err
		}
	}
	return store.Follow(ctx, r.js, store.TailConfig{Stream: r.cfg.Stream.Name,
		Filter: r.subj.StoredPartitionAll(p.id), Start: from, Heartbeat: readHeartbeat,
		EndOnLoss: true})
}

// madeFollow is a session's read made at its start, beside the reads of
// its checkpoint's bounds and states (a session without a checkpoint
// starts from the stream's first message whatever they say: issue 27,
// its consumer's creation was a round trip after them). tail and err
// are written by its goroutine, read once done is closed.
type madeFollow struct {
	done  chan struct{}
	tail  *store.Tail
	err   error
	taken bool
}

// followAtStart makes the partition's read from from in a goroutine of
// its own, under ctx: take waits for it; drop stops a read not taken.
func (p *partition) followAtStart(ctx context.Context, from uint64) *madeFollow {
	m := &madeFollow{done: make(chan struct{})}
	go func() {
		defer close(m.done)
		m.tail, m.err = p.follow(ctx, from)
	}()
	return m
}

// take waits for the read and hands it over (consume stops it).
func (m *madeFollow) take() (*store.Tail, error) {
	<-m.done
	m.taken = true
	return m.tail, m.err
}

// drop stops the read unless it was taken, once made: a session that
// ended before its consume leaves no consumer behind.
func (m *madeFollow) drop() {
	if m == nil {
		return
	}
	<-m.done
	if !m.taken && m.tail != nil {
		m.tail.Stop()
	}
}

func (s *session) consume(ctx context.Context) error {
	r := s.p.r
	follow := s.p.follow
	var (
		tail *store.Tail
		err  error
	)
	if s.made != nil {
		tail, err = s.made.take()
		s.made = nil
	} else {
		tail, err = follow(ctx, s.checkpoint+1)
	}
	if err != nil && ctx.Err() == nil && store.Unanswered(err) {
		// The consumer's creation got no answer: the session's server
		// went away with it, or the cluster is electing a leader (a
		// session starts at a takeover, or after another one ended).
		// Ride it out as a tail lost mid-read does (refollow), not by
		// ending the session: it would refold its partition from the
		// snapshot again, and again while the election lasts.
		tail, err = s.refollow(ctx, follow)
	}
	if err != nil {
		return err
	}
	defer func() { tail.Stop() }()
	if err := s.takeHeld(); err != nil {
		return err
	}
	s.followed = time.Since(s.began)
	s.quietN, s.quietSince = s.n, time.Now()
	watched := make(chan struct{})
	defer close(watched)
	go s.watchTurns(watched, s.p.r.cfg.tuning.readStall())
	s.ctx = ctx
	defer s.stopRest()
	if s.lazy && tail.Empty() {
		// Nothing of the partition to refold: read its states beside
		// the fold.
		s.startRest(ctx)
	}
	if (!s.recovering || tail.Empty()) && s.rest == nil {
		s.endLoad() // nothing to refold
	}
	elected := r.elected()

	// Publishing and checkpointing outlive a stop request: the event in
	// hand finishes, and the final snapshot is written. Not a lost
	// lease: that cancels them at once.
	work, cancelWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelWork(nil)
	defer context.AfterFunc(s.p.revoked, func() {
		if err := s.p.lost(); err != nil {
			cancelWork(err)
		}
	})()
	defer s.abandonWrite(func() { cancelWork(errSessionOver) })
	tick := time.NewTicker(r.cfg.SnapshotInterval)
	defer tick.Stop()
	// readOn moves the read to a new consumer from the event after the
	// last one folded, keeping the state: nothing is refolded (issue 24).
	// The old tail is stopped aside: its iterator and the deletion of its
	// consumer may wait out timeouts against a dead server. A ctx ended
	// meanwhile is not an error: the loop's stop writes the final
	// snapshot.
	readOn := func() error {
		next, err := s.refollow(ctx, follow)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go tail.Stop()
		tail = next
		s.quietN, s.quietSince = s.n, time.Now()
		return nil
	}
	// item handles one item of the read: a message folded (and a
	// checkpoint when one is due), or the read's end.
	item := func(it store.Tailed) error {
		if errors.Is(it.Err, store.ErrConsumerLost) {
			// The server holding the consumer stopped (any server of
			// the cluster may hold it, not only the stream's leader),
			// or a delivery was lost.
			r.log.Info("partition read lost its consumer: reading on through a new one", "partition", s.p.id, "err", it.Err)
			r.m.ReadsMoved.WithLabelValues("lost").Inc()
			return readOn()
		}
		if it.Err != nil {
			return it.Err
		}
		if err := s.handle(work, it.Msg, it.Meta); err != nil {
			return err
		}
		if s.recovering && s.recoveryCheckpointDue() {
			return s.checkpointNow(work, true)
		} else if !s.recovering && s.since >= r.cfg.SnapshotEvery {
			return s.checkpointLive(work, false)
		}
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			if err := s.p.lost(); err != nil {
				return err
			}
			cctx, cancel := context.WithTimeout(work, 30*time.Second)
			defer cancel()
			return s.checkpointNow(cctx, true)
		case <-tick.C:
			s.turns.Add(1)
			if s.readStalled(work, tail) {
				r.m.ReadsMoved.WithLabelValues("stalled").Inc()
				if err := readOn(); err != nil {
					return err
				}
			}
			if s.recovering {
				if err := s.recoveryIdle(work); err != nil {
					return err
				}
			}
			if s.recovering {
				// A recovery checkpoints only where nothing it deferred is
				// left to publish, and then puts every changed state.
				if s.recoveryCheckpointDue() {
					if err := s.checkpointNow(work, true); err != nil {
						return err
					}
				}
				break
			}
			// A partition that folded nothing since its last checkpoint
			// puts every state still unwritten: once input stops, the
			// checkpoint covers every event folded an interval later.
			if err := s.checkpointLive(work, s.since == 0); err != nil {
				return err
			}
		case <-s.writeDone():
			if err := s.takeWrite(); err != nil {
				return err
			}
			if s.due {
				if err := s.checkpointLive(work, false); err != nil {
					return err
				}
			}
		case <-elected:
			// A new stream leader: the read moves only when its
			// consumer is gone with the old one, or does not answer
			// (readGone).
			elected = r.elected()
			if s.readGone(work, tail) {
				r.m.ReadsMoved.WithLabelValues("elected").Inc()
				if err := readOn(); err != nil {
					return err
				}
			}
		case <-s.restDone():
			if err := s.mergeRest(ctx); err != nil {
				return err
			}
		case it := <-tail.C():
			if err := item(it); err != nil {
				return err
			}
		}
	}
}

// handle folds one message and publishes its effects.
func (s *session) handle(ctx context.Context, msg jetstream.Msg, meta *jetstream.MsgMetadata) error {
	p := s.p
	seq := meta.Sequence.Stream
	if s.recovering && seq > s.lastAtStart {
		if err := s.caughtUp(ctx); err != nil {
			return err
		}
	}
	s.lag.Set(float64(meta.NumPending))
	if err := s.fold(ctx, msg, meta); err != nil {
		return err
	}
	s.folded = seq
	p.folded.Store(seq)
	s.since++
	if s.recovering && s.early != nil {
		s.probe()
		if err := s.pump(ctx); err != nil {
			return err
		}
	}
	if s.recovering && meta.NumPending == 0 && seq < s.lastAtStart {
		// Nothing pending, as the consumer's server has the stream: the
		// server may place the consumer on a replica behind the leader,
		// which reports nothing pending before what it has not applied.
		// Whether the leader holds a message of the partition past this
		// one says whether any is left (leftToRead): when one is, the
		// read goes on (one past lastAtStart ends the recovery above).
		if left, err := s.leftToRead(ctx); err != nil || left {
			return err
		}
	}
	if s.recovering && meta.NumPending == 0 {
		// Caught up: nothing of the partition up to lastAtStart is left.
		return s.caughtUp(ctx)
	}
	return nil
}

// leftToRead reports whether the stream's leader holds a message of the
// partition past the last one folded: a recovery whose consumer reports
// nothing pending reads on then. None at all (a limit removed them) is
// nothing left.
//
// Within leftScanMax messages of lastAtStart it asks for the partition's
// first message past the last one folded (store.LeaderReads.NextMsg),
// which the server finds by looking at those messages; farther, for the
// partition's last message, which it finds by matching every subject of
// the partition (a cost that grows with the nodes, not the messages).
// Both answer the same question. A restart's tail ends within a few
// thousand messages of lastAtStart in every partition but the last
// written, and each asked for its last message there: 15 of the
// server's walks over a partition's subjects a restart, ~44,000
// subjects each at 100,000 nodes (issue 27, the restart's ratio).
func (s *session) leftToRead(ctx context.Context) (bool, error) {
	defer s.enter(&stepLeft)()
	p := s.p
	leader := store.Leader(p.r.js, p.r.cfg.Stream.Name)
	filter := p.r.subj.StoredPartitionAll(p.id)
	near := s.folded >= s.lastAtStart || s.lastAtStart-s.folded <= s.p.r.cfg.tuning.leftScan()
	var m *jetstream.RawStreamMsg
	err := p.leaderRead(ctx, func(ctx context.Context) (err error) {
		if near {
			m, err = leader.NextMsg(ctx, s.folded+1, filter)
		} else {
			m, err = leader.GetLastMsgForSubject(ctx, filter)
		}
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		return err
	})
	if err != nil {
		return false, fmt.Errorf("partition %d's messages past %d: %w", p.id, s.folded, err)
	}
	return m != nil && m.Sequence > s.folded, nil
}

// leftScanMax bounds the messages between the last one folded and
// lastAtStart over which leftToRead asks for the partition's next message
// rather than its last: the server's look for the next one goes through
// the messages past the one folded (those of other partitions) block by
// block, so a partition whose last message is far behind the stream's end
// would have it read the blocks of everything written since. 65,536
// messages are a few of the stream's blocks, which the partition's own
// consumer has just gone through. A Reconciler's own in tests
// (tuning).
const leftScanMax uint64 = 1 << 16

// recoveryIdle ends a recovery that handled no message for
// recoveryIdleAfter (at least one snapshot tick), short of lastAtStart,
// when the partition's last message as the stream's leader has it is no
// longer past the last one folded: a limit removed what was left before
// the consumer delivered it. The read otherwise waited for a message past
// lastAtStart to end the recovery (its deferred effects unpublished
// meanwhile), which may never come (reviewer's finding); a consumer on a
// replica behind the leader is still waited for, as in handle. One get
// a recoveryIdleAfter of idleness at most: farther than leftScanMax
// behind the stream's end the get matches every subject of the
// partition on the server, a cost that grows with the nodes, and
// with a short snapshot interval (20 ms) a refold whose read paused
// between two batches asked at nearly every tick (issue 27, a cold
// refold's cost per node).
func (s *session) recoveryIdle(ctx context.Context) error {
	if s.n != s.tickN || s.n == 0 || s.folded >= s.lastAtStart {
		s.tickN, s.idleTicks = s.n, 0
		return nil
	}
	s.idleTicks++
	if s.idleTicks < idleTicksToAsk(s.p.r.cfg.SnapshotInterval) {
		return nil
	}
	s.idleTicks = 0
	if left, err := s.leftToRead(ctx); err != nil || left {
		return err
	}
	s.p.r.log.Info("partition's recovery ends short of the stream's end at its start: a limit removed the rest",
		"partition", s.p.id, "folded", s.folded, "recovering_to", s.lastAtStart)
	return s.caughtUp(ctx)
}

// readStallAfter is how long a partition's read may deliver nothing
// before its session asks the read's consumer whether it holds input it
// has not delivered (readStalled), and then how long between two asks
// while the read stays quiet. A Reconciler's own in tests (tuning).
const readStallAfter = 10 * time.Second

// readStallAsk bounds that ask.
const readStallAsk = 2 * time.Second

// readStalled reports, at a snapshot tick, whether the partition's read
// has stalled: it delivered nothing for readStallAfter (nothing it
// delivered waits in the tail either), and its consumer says it holds
// messages of the partition it has not delivered, or does not answer
// within readStallAsk (its server gone, or the consumer). The session
// then reads on through a new consumer from the message after the last
// one folded (readOn), its state kept, and says so at warn level. The
// client ends a read whose heartbeats stop (store.ErrConsumerLost), but
// a consumption can go quiet with its heartbeats still coming, or with
// the client's missed-heartbeat check not rearmed after a reconnect: a
// partition then planned nothing, and logged nothing, until the
// reconciler restarted (TestClusterChaos, once: 55 s after a kill).
// An idle partition costs one ask of its consumer's info every
// readStallAfter (docs/architecture.md, "A quiet read is asked").
func (s *session) readStalled(ctx context.Context, tail *store.Tail) bool {
	now := time.Now()
	if s.n != s.quietN || len(tail.C()) > 0 {
		s.quietN, s.quietSince, s.stallAfter = s.n, now, 0
		return false
	}
	quiet, after := now.Sub(s.quietSince), s.p.r.cfg.tuning.readStall()
	if s.stallAfter > 0 {
		after = s.stallAfter
	}
	if quiet < after {
		return false
	}
	s.quietSince, s.stallAfter = now, 0 // asked again a readStallAfter later, if still quiet
	actx, cancel := context.WithTimeout(ctx, readStallAsk)
	pending, err := tail.Pending(actx)
	cancel()
	if (err == nil && pending == 0) || ctx.Err() != nil {
		return false // idle: nothing to read
	}
	if err != nil {
		s.p.r.log.Warn("partition read quiet and its consumer unanswered: reading on through a new one",
			"partition", s.p.id, "quiet", quiet.Round(time.Millisecond), "folded", s.folded, "err", err)
	} else {
		s.p.r.log.Warn("partition read stalled: its consumer holds input it does not deliver; reading on through a new one",
			"partition", s.p.id, "quiet", quiet.Round(time.Millisecond), "pending", pending, "folded", s.folded)
	}
	return true
}

// electionStallAfter is how quiet a read may be, after a new stream
// leader's check found its consumer holding input it had not delivered
// yet (readGone), before the consumer is asked again (readStalled): two
// of its heartbeats.
const electionStallAfter = 2 * readHeartbeat

// readGone reports, when the stream has a new leader, whether the
// partition's read must move to a new consumer: its consumer does not
// answer within readStallAsk (its server gone, as the old leader is
// after a crash, or the client's connection with it) or is gone (not
// found). A consumer lives on whichever server of the stream's peers
// it was placed on, not on the leader, and one on a server that still
// runs reads on across the change (checked on a 3-server cluster with
// stepdowns: TestTailsReadOnAcrossStepdowns); before, every election
// moved every partition to a new consumer, one creation and one
// deletion each asked of the meta leader. A consumer that answers and
// holds input the read has not handled yet is asked again once the read
// has been quiet for electionStallAfter instead of readStallAfter
// (readStalled): a read that stalled with the change moves within
// seconds, as it did. A consumer lost with its server also ends its
// read on its own after two missed heartbeats (store.ErrConsumerLost),
// usually before the election. docs/architecture.md, "A new stream
// leader moves only the reads it took".
func (s *session) readGone(ctx context.Context, tail *store.Tail) bool {
	actx, cancel := context.WithTimeout(ctx, readStallAsk)
	pending, err := tail.Pending(actx)
	cancel()
	if ctx.Err() != nil {
		return false // the session is ending: nothing to move
	}
	if err != nil {
		s.p.r.log.Info("the stream has a new leader and the partition's consumer is gone or unanswered: reading on through a new one",
			"partition", s.p.id, "folded", s.folded, "err", err)
		return true
	}
	if pending > 0 {
		s.quietN, s.quietSince, s.stallAfter = s.n, time.Now(), electionStallAfter
	}
	return false
}

// The steps of a session that may wait on the server (enter, watchTurns).
var (
	stepAcks       = "awaiting its effects' acknowledgements"
	stepRecovery   = "publishing its recovery's effects"
	stepEarly      = "publishing its first refold's effects"
	stepCheckpoint = "writing a checkpoint"
	stepWrite      = "awaiting a checkpoint's write"
	stepFollow     = "creating its read's consumer"
	stepLeft       = "asking the stream's leader for the partition's next message"
)

// enter names the step the session waits in until the returned func is
// called (deferred by the step).
func (s *session) enter(step *string) (leave func()) {
	prev := s.step.Swap(step)
	return func() { s.step.Store(prev) }
}

// stuckAfter is, in readStallAfters, how long the session's loop may
// fold nothing and take no snapshot tick before watchTurns says so.
const stuckAfter = 3

// watchTurns, on a goroutine of its own until done is closed, says at
// warn level, every readStallAfter (every), that the session's loop has folded
// nothing and taken no snapshot tick for stuckAfter readStallAfters or
// more: it is in one step that still waits, named when it is one of
// enter's. Every wait of a step is bounded (docs/architecture.md, "Every
// wait of a partition session is bounded"), so the line says where a
// partition that plans nothing is, and for how long, not that it is
// lost: a silent partition was the one thing an operator could not
// read (TestClusterChaos, once: 55 s without a line). A first refold's
// publishes at 100,000 nodes may last long enough to be named.
func (s *session) watchTurns(done <-chan struct{}, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	folded, turns, since := s.p.folded.Load(), s.turns.Load(), time.Now()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		f, n := s.p.folded.Load(), s.turns.Load()
		if f != folded || n != turns {
			folded, turns, since = f, n, time.Now()
			continue
		}
		if time.Since(since) < stuckAfter*every {
			continue
		}
		step := "folding an event"
		if p := s.step.Load(); p != nil {
			step = *p
		}
		s.p.r.log.Warn("partition session still in one step: nothing folded and no snapshot tick taken",
			"partition", s.p.id, "step", step, "for", time.Since(since).Round(time.Second), "folded", f)
	}
}

// recoveryIdleAfter is how long a recovering session handles no message
// before recoveryIdle asks the stream's leader whether its end is still
// to come, and then how long between two asks while it stays idle.
const recoveryIdleAfter = time.Second

// idleTicksToAsk is how many snapshot ticks of interval make
// recoveryIdleAfter: one at the default interval (a second) or longer,
// as many as fit in it at a shorter one.
func idleTicksToAsk(interval time.Duration) int {
	if interval <= 0 {
		return 1
	}
	return max(1, int(recoveryIdleAfter/interval))
}

// caughtUp ends the recovery and writes a checkpoint at once: what the
// session refolded is then not refolded again, however soon the next
// restart comes. Without it the first checkpoint waited for the snapshot
// interval (or SnapshotEvery events), and restarts faster than that
// refolded the same tail each time (issue 13).
func (s *session) caughtUp(ctx context.Context) error {
	if err := s.endRecovery(ctx); err != nil {
		return err
	}
	refolded := time.Since(s.began)
	if err := s.checkpointNow(ctx, true); err != nil {
		return err
	}
	if s.lazy && s.rest == nil {
		// A restart's account, at debug level: the tail's refold and
		// its reads by key, then the checkpoint (issue 27).
		s.p.r.log.Debug("partition tail refolded and checkpointed", "partition", s.p.id, "events", s.n,
			"consumer_ms", s.followed.Milliseconds(), "refold_ms", refolded.Milliseconds(), "fetches", s.fetches, "fetch_ms", s.fetchTook.Milliseconds(),
			"checkpointed_ms", time.Since(s.began).Milliseconds())
		// The rest of the states are read beside the fold from here;
		// the load ends when they are merged (mergeRest).
		s.startRest(s.ctx)
		return nil
	}
	// A recovery's account, at debug level: its consumer made, its
	// refold, its final checkpoint, each from the session's start (the
	// bench reads a cold refold's fixed costs from it, issue 27).
	s.p.r.log.Debug("partition refolded and checkpointed", "partition", s.p.id, "events", s.n,
		"consumer_ms", s.followed.Milliseconds(), "refold_ms", refolded.Milliseconds(),
		"checkpointed_ms", time.Since(s.began).Milliseconds())
	if s.rest == nil {
		s.endLoad()
	}
	return nil
}

func (s *session) fold(ctx context.Context, msg jetstream.Msg, meta *jetstream.MsgMetadata) error {
	r, p := s.p.r, s.p
	seq := meta.Sequence.Stream
	var start time.Time
	s.n++
	timed := s.n%foldSample == 0
	if timed {
		start = time.Now()
	}
	node, kind, by, err := r.subj.ParseBy(msg.Subject())
	if err != nil {
		r.badSubject(ctx, seq, msg.Subject())
		return nil
	}
	own := false
	if kind.Effect() && s.recovering {
		id, valid := store.EffectIDOf(r.key, msg.Headers().Get(jetstream.MsgIDHeader))
		own = valid && kind == events.KindPlan && s.ownStored(node, id, msg)
		s.rec.seen(node, kind, seq, id, valid)
	}
	if !kind.Input() {
		// Knocks and journal entries: the reconciler's own notes, not
		// inputs of the fold; their payloads are not even decoded (a
		// cold catch-up read every one of them, issue 17).
		return nil
	}
	if r.tr != nil && !s.recovering {
		// The fold's span, under the event's traceparent; the effects'
		// publishes are its children. A recovery's refold is not traced:
		// those events were folded (and traced) before.
		var span trace.Span
		ctx, span = r.tr.Start(tracing.Extract(ctx, msg.Headers()), "fold "+string(kind), trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(tracing.Node.String(node), tracing.Kind.String(string(kind)), tracing.SeqAttr(tracing.Seq, seq)))
		defer span.End()
	}
	ev := events.Event{Seq: seq, Time: meta.Timestamp, Node: node, Kind: kind, Size: len(msg.Data())}
	ev.Payload, ev.Err = s.in.dec.Decode(kind, msg.Data())
	if err := events.Attribute(ev.Payload, by); err != nil {
		// A named operator's event whose by names someone else: the
		// server checked the subject's name, not the payload's.
		ev.Payload, ev.Err = nil, err
	}
	if ev.Kind == events.KindPlan && r.cfg.Own != nil && !own && !s.ownRead(node, msg) {
		if err := r.cfg.Own.Verify(ev.Node, ev.Kind, msg.Headers(), msg.Data()); err != nil {
			ev.Foreign = true
			r.log.Error("plan not emitted by this reconciler: not folded; its last plan is published again",
				"node", ev.Node, "seq", seq, "err", err)
		} else if r.cfg.Signer != nil && msg.Headers().Get(store.HeaderSigner) != r.cfg.Signer.PublicKey() {
			ev.OldKey = true
		}
	}
	if ev.Payload != nil {
		// A payload read on the fast path has the interner's strings
		// already, and no slice with room to spare (events.Decoder.Fast):
		// interning it again found every string and copied every file
		// list, 2 % of a dense first refold (issue 27, item 1); only its
		// lists are shared.
		s.in.read(ev.Payload)
	}
	if s.lazy {
		n, ft, t0 := s.fetches, s.fetchTook, time.Now()
		if err := s.fetch(ctx, ev.Node); err != nil {
			return err
		}
		if s.rest != nil && s.fetches > n {
			// A node read by key while the pass runs (its first event
			// since the tail): where its event's time went, at debug
			// level (issue 27).
			defer func(stored time.Duration) {
				r.log.Debug("node read by key beside the pass", "partition", p.id, "node", ev.Node, "kind", kind,
					"stored_ago_ms", stored.Milliseconds(), "fetch_ms", (s.fetchTook - ft).Milliseconds(), "took_ms", time.Since(t0).Milliseconds())
			}(t0.Sub(meta.Timestamp))
		}
	}
	p.mu.Lock()
	st := p.states[ev.Node]
	if st == nil {
		st = reconcile.NewState(ev.Node)
		p.states[ev.Node] = st
	}
	effs := st.Fold(ev)
	s.in.folded(st, effs)
	p.mu.Unlock()
	if ev.Err == nil {
		if a, ok := livenessOf(ev.Payload); ok && a.State == events.AgentDown {
			r.downs.add(store.LeaseKey(ev.Node, ev.Kind))
		}
	}
	if timed {
		r.m.Folding.Observe(time.Since(start).Seconds())
	}
	if ev.Err != nil {
		r.m.Rejected.Inc() // logged with its journal entry, once
	} else {
		s.foldedCounter(ev.Kind).Inc()
	}
	if d, ok := s.dirty[ev.Node]; ok {
		d.st = st
		s.dirty[ev.Node] = d
	} else {
		s.dirty[ev.Node] = dirtyNode{st: st, first: seq, gen: s.gen}
	}
	if err := fault(r.cfg.Faults.AfterFold, p.id, seq); err != nil {
		return err
	}
	tp := ""
	if s.recovering && s.rt != nil {
		s.rt.refolded(seq, len(effs))
		if len(effs) > 0 {
			tp = msg.Headers().Get(tracing.Header)
		}
	}
	for _, e := range effs {
		if s.recovering {
			if !s.publishEarlyCaused(e, tp) {
				s.rec.deferCaused(e, tp)
			}
			continue
		}
		if err := s.publish(ctx, e); err != nil {
			return err
		}
	}
	return fault(r.cfg.Faults.AfterPublish, p.id, seq)
}

// endRecovery publishes what earlyPub still holds (a first refold), then
// the deferred effects that were not seen stored,
// each fenced by its subject's last sequence (Nats-Expected-Last-Subject-
// Sequence), and leaves recovery. Effects of different subjects do not
// wait for each other: the first unpublished effect of every subject is
// sent asynchronously (at most recoveryWindow in flight), and a subject's
// next effect is sent once the one before it is acknowledged, fenced
// behind the sequence that acknowledgement gives. So a subject's effects
// are stored in order, each behind the one before, as one at a time
// stored them; a cold refold that publishes its plans costs a round trip
// per plan of the busiest node instead of two per effect (issue 17), and
// no subject waits for the acknowledgements of others (issue 27: waves,
// each wholly acknowledged before the next was sent, left the server and
// the session idle in turn).
func (s *session) endRecovery(ctx context.Context) error {
	r := s.p.r
	if s.early != nil {
		if err := s.drainEarly(ctx); err != nil {
			return err
		}
		s.early = nil
	}
	order, queues := s.rec.unpublished()
	skipped := s.rec.skipped(countQueued(queues))
	r.m.Skipped.Add(float64(skipped))
	if err := s.publishFenced(ctx, order, queues); err != nil {
		return err
	}
	s.recovering = false
	s.rec = nil
	s.rt.end(skipped, nil)
	return nil
}

// countQueued is the number of effects queues hold.
func countQueued(queues map[effectKey][]toPublish) int {
	n := 0
	for _, q := range queues {
		n += len(q)
	}
	return n
}

// recoveryWindow bounds the fenced publishes of endRecovery in flight,
// below the client's default limit of 4000 pending async publishes.
const recoveryWindow = 1024

// prepareWindow bounds how many effects prepareAhead has prepared that
// the session has not taken yet: as many as may be sent at once
// (recoveryWindow), so a send finds its message ready, and no more, so
// that a recovery whose sends wait for acknowledgements (a node's chain
// of fenced plans) does not hold every effect's encoded and signed
// message at once (a first refold of 100,000 nodes makes one or more
// plans a node). A Reconciler's own in tests (tuning).
const prepareWindow = recoveryWindow

// errStalled: an effect was not sent because the connection's limit of
// pending asynchronous publishes stayed full for the client's stall
// wait (jetstream.ErrTooManyStalledMsgs); it is sent again once there is
// room. Every session of the process shares that limit.
var errStalled = errors.New("engine: the connection's pending publishes are at their limit")

// preparedEffect is a deferred effect's message, prepared for the send
// (store.Publisher.Prepare) by whichever of prepareAhead's goroutine and
// the session takes it first (state: 0 free, 1 taken, 2 done).
type preparedEffect struct {
	state atomic.Int32
	id    string // the message id
	msg   *store.Prepared
	err   error
	ahead bool // prepared by prepareAhead: it holds a slot until taken
}

// prepared is prepareAhead's work: each subject's effects' messages, in
// its queue's order.
type prepared struct {
	of map[effectKey][]*preparedEffect
	// slots holds one token for each effect prepareAhead prepared that
	// the session has not taken: its capacity, prepareWindow, bounds
	// them.
	slots  chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

// prepareAhead prepares, on a goroutine of its own, the messages of the
// effects queues holds, in the order a recovery sends them (every
// subject's first, then every subject's second, …): their encoding, keyed
// id and ed25519 signature (~50 µs a plan under load, 15-18 % of a first
// refold's CPU) are then done while the session waits for
// acknowledgements, instead of between an acknowledgement and the send it
// frees, where each of a node's chain of plans waited for it (issue 27).
// It runs at most prepareWindow effects ahead of the session's takes: it
// waits for a slot before each. Only effects to publish are prepared;
// stop ends it.
func prepareAhead(ctx context.Context, r *Reconciler, order []effectKey, queues map[effectKey][]toPublish) *prepared {
	ctx, cancel := context.WithCancel(ctx)
	p := &prepared{of: make(map[effectKey][]*preparedEffect, len(order)), slots: make(chan struct{}, r.cfg.tuning.prepare()),
		cancel: cancel, done: make(chan struct{})}
	depth := 0
	for _, k := range order {
		q := queues[k]
		ps := make([]*preparedEffect, len(q))
		for i, x := range q {
			ps[i] = &preparedEffect{id: x.id}
		}
		p.of[k] = ps
		depth = max(depth, len(q))
	}
	// The goroutine's own list, in the order of the sends: the session
	// moves queues and p.of on meanwhile.
	type item struct {
		e  reconcile.Effect
		pe *preparedEffect
	}
	var items []item
	for i := range depth {
		for _, k := range order {
			if q := queues[k]; i < len(q) {
				items = append(items, item{q[i].e, p.of[k][i]})
			}
		}
	}
	go func() {
		defer close(p.done)
		for i, it := range items {
			items[i] = item{} // the session holds what it still needs
			if ctx.Err() != nil {
				return
			}
			select {
			case p.slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			if !p.prepare(ctx, r, it.e, it.pe, true) {
				<-p.slots // the session prepared it itself
			}
		}
	}()
	return p
}

// prepare prepares pe, effect e's message, unless another goroutine took
// it; ahead when prepareAhead's goroutine does.
func (p *prepared) prepare(ctx context.Context, r *Reconciler, e reconcile.Effect, pe *preparedEffect, ahead bool) bool {
	if !pe.state.CompareAndSwap(0, 1) {
		return false
	}
	pe.id = store.EffectMsgID(r.key, pe.id)
	pe.msg, pe.err = r.pub.Prepare(ctx, e.Node, e.Payload, r.publishOpts(e, pe.id)...)
	pe.ahead = ahead
	pe.state.Store(2)
	return true
}

// take returns pe, effect e's message, prepared: by the session itself
// when prepareAhead has not taken it yet, else once prepareAhead is done
// with it (freeing its slot, once: a stalled send takes the same effect
// again).
func (p *prepared) take(ctx context.Context, r *Reconciler, e reconcile.Effect, pe *preparedEffect) *preparedEffect {
	if !p.prepare(ctx, r, e, pe, false) {
		for pe.state.Load() != 2 {
			runtime.Gosched()
		}
		if pe.ahead {
			// Once: a send the connection's pending limit refused
			// (errStalled) takes the same effect again.
			pe.ahead = false
			<-p.slots
		}
	}
	return pe
}

// stop ends prepareAhead's goroutine and waits for it.
func (p *prepared) stop() {
	p.cancel()
	<-p.done
}

// publishFenced publishes every effect of queues, a subject's in order,
// each fenced by its subject's last sequence: a subject's next effect is
// sent when the one before it is acknowledged (or refused as poison),
// the subjects taken in turn from order, at most recoveryWindow effects
// in flight; acknowledgements are taken in the order sent (one stream
// answers in that order).
func (s *session) publishFenced(ctx context.Context, order []effectKey, queues map[effectKey][]toPublish) error {
	defer s.enter(&stepRecovery)()
	r := s.p.r
	type sent struct {
		x     toPublish
		id    string // the message id
		fence uint64
		pm    *store.Prepared // the message, to send again (pubride.go)
		ok    <-chan *jetstream.PubAck
		errc  <-chan error
		at    time.Time
		sends sends
		stale int        // its stale conflicts (conflicted)
		span  trace.Span // its publish's, when tracing (recoveryTrace)
	}
	// ready holds the subjects whose next effect may be sent (none of
	// theirs in flight), in turn.
	ready := slices.Clone(order)
	var inflight []sent
	// preps holds each queued effect's message, prepared (encoded, its
	// id keyed, signed) by prepareAhead or by send, whichever takes it
	// first.
	preps := prepareAhead(ctx, r, order, queues)
	defer preps.stop()
	// next moves subject k's queue on past the effect just stored (or
	// dropped) and makes k ready again when more are left.
	next := func(k effectKey) {
		q := queues[k][1:]
		queues[k] = q
		preps.of[k][0] = nil // its message is sent: let it go
		preps.of[k] = preps.of[k][1:]
		if len(q) > 0 {
			ready = append(ready, k)
		}
	}
	// poison journals e, refused as poison, in its node's journal
	// subject's chain: its entry (poisonEntry) is queued there, sent
	// behind the subject's effect in flight, if any, fenced at the
	// subject's last sequence, and its acknowledgement moves the fence
	// (as earlyPub.poison: an unfenced append made the subject's next
	// effect fail its fence). Call it before next moves e's subject on
	// (the journal subject may be e's own, with e first in its queue).
	poison := func(e reconcile.Effect, cause error) {
		x := s.poisonEntry(e, cause)
		k := effectKey{x.e.Node, x.e.Kind}
		if len(queues[k]) == 0 {
			ready = append(ready, k) // none of its effects in flight
		}
		queues[k] = append(queues[k], x)
		preps.of[k] = append(preps.of[k], &preparedEffect{id: x.id})
	}
	// send sends the next effect of ready's first subject, or drops it
	// as poison; errStalled when the connection's pending limit is full
	// (the effect stays first).
	send := func() error {
		k := ready[0]
		x := queues[k][0]
		e := x.e
		pm := preps.take(ctx, r, e, preps.of[k][0])
		id := pm.id
		fence, known := s.rec.fence(e)
		if !known && !s.readAll {
			// Nothing on the subject since the checkpoint: its last
			// message, if any, is older. (When the read began at the
			// stream's first message, there is none: 0, and a message a
			// second writer stored since makes the publish fail.)
			// From the stream's leader (lastOnSubject).
			m, err := s.lastOnSubject(ctx, e)
			switch {
			case errors.Is(err, store.ErrNoMessage):
			case err != nil:
				return fmt.Errorf("publish %s: %w", id, err)
			default:
				fence = m.Event.Seq
			}
		}
		if err := s.p.lost(); err != nil {
			return err
		}
		err := pm.err
		var f jetstream.PubAckFuture
		var span trace.Span
		var injected error
		if err == nil {
			span = s.rt.publishing(x, id, pm.msg)
			if injected = s.injectedAnswer(id); injected == nil {
				f, err = r.pub.SendAsync(pm.msg, true, fence)
			}
		}
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) && ctx.Err() == nil {
			s.rt.stalled(id, span)
			return errStalled
		}
		ready = ready[1:]
		if store.Permanent(err) {
			s.rt.answered(span, nil, err)
			if x.poison {
				s.poisonLost(x, err)
			} else {
				poison(e, err)
			}
			next(k)
			return nil
		}
		sx := sent{x: x, id: id, fence: fence, pm: pm.msg, at: time.Now(), span: span}
		switch {
		case injected != nil:
			sx.ok, sx.errc = failedSend(injected)
			sx.sends.out = true
		case err == nil:
			s.remember(f.Msg())
			sx.ok, sx.errc = f.Ok(), f.Err()
			sx.sends.out = true
			s.effectSent(id)
		case resendable(err) && pm.msg != nil:
			sx.ok, sx.errc = failedSend(err) // sent again in its turn
		default:
			s.rt.answered(span, nil, err)
			return fmt.Errorf("publish %s (fenced at %d): %w", id, fence, err)
		}
		inflight = append(inflight, sx)
		return nil
	}
	// again sends the effects in flight again (those sendAgain picks),
	// in order, once the oldest got cause (resendable) for an answer and
	// the ride-out allows it (rideAgain). A send refused sends no later
	// one: each left unsent takes that refusal for its answer.
	var ride pubRide
	again := func(cause error) error {
		x := inflight[0]
		if err := s.rideAgain(ctx, &ride, fmt.Errorf("publish %s (fenced at %d): %w", x.id, x.fence, cause), len(inflight)); err != nil {
			return err
		}
		var refused error
		for i := range inflight {
			x := &inflight[i]
			var resend bool
			if resend, x.ok, x.errc = sendAgain(i, cause, x.ok, x.errc); !resend {
				continue
			}
			if refused == nil {
				if injected := s.injectedAnswer(x.id); injected != nil {
					x.ok, x.errc = failedSend(injected)
					x.sends.again(true)
					continue
				}
				var f jetstream.PubAckFuture
				if f, refused = r.pub.ResendAsync(x.pm, true, x.fence); refused == nil {
					x.ok, x.errc = f.Ok(), f.Err()
					x.sends.again(true)
					continue
				}
			}
			x.ok, x.errc = failedSend(refused)
			x.sends.again(false)
		}
		return nil
	}
	effects := map[events.Kind]prometheus.Counter{}
	// answered takes the acknowledgement (or the error) of x, the oldest
	// effect in flight, and moves its subject on.
	answered := func(x sent, ack *jetstream.PubAck, err error) error {
		e := x.x.e
		s.rt.answered(x.span, ack, err)
		switch {
		case err != nil:
			err = store.ServerError(err)
			if !store.Permanent(err) {
				return fmt.Errorf("publish %s (fenced at %d): %w", x.id, x.fence, err)
			}
			if x.x.poison {
				s.poisonLost(x.x, err)
			} else {
				poison(e, err)
			}
		default:
			r.m.Publishing.Observe(time.Since(x.at).Seconds())
			// A duplicate (a copy stored first, which the read had not
			// reached) moves the fence too, unless the fence is later:
			// as earlyAnswered (fenceAfter).
			s.rec.published(e, fenceAfter(x.fence, ack))
			if x.sends.counts(ack) && !x.x.poison {
				c, ok := effects[e.Kind]
				if !ok {
					c = r.m.Effects.WithLabelValues(string(e.Kind))
					effects[e.Kind] = c
				}
				c.Inc()
				r.logJournal(e)
			}
		}
		inflight = inflight[1:]
		next(effectKey{e.Node, e.Kind})
		return nil
	}
	// done waits for the answer to the oldest effect in flight (each
	// wait bounded by ackTimeout), then takes every answer already
	// arrived, in order, without waiting: one wake-up for a burst of
	// acknowledgements, and the sends they free go out together.
	timer := time.NewTimer(ackTimeout)
	defer timer.Stop()
	done := func() error {
		for {
			x := inflight[0]
			timer.Reset(ackTimeout)
			ack, err, werr := s.awaitAck(ctx, x.ok, x.errc, timer)
			if werr != nil {
				return werr
			}
			ack, err = s.judged(ctx, x.x.e, x.id, x.fence, &inflight[0].stale, ack, err)
			if err != nil && resendable(err) {
				if err := again(err); err != nil {
					return err
				}
				continue // the same effect's answer, sent again
			}
			ride.answered()
			if err := answered(x, ack, err); err != nil {
				return err
			}
			break
		}
		for len(inflight) > 0 {
			x := inflight[0]
			var (
				ack *jetstream.PubAck
				err error
			)
			select {
			case ack = <-x.ok:
			case err = <-x.errc:
			default:
				return nil
			}
			ack, err = s.judged(ctx, x.x.e, x.id, x.fence, &inflight[0].stale, ack, err)
			if err != nil && resendable(err) {
				return again(err)
			}
			ride.answered()
			if err := answered(x, ack, err); err != nil {
				return err
			}
		}
		return nil
	}
	for len(ready) > 0 || len(inflight) > 0 {
		for len(ready) > 0 && len(inflight) < recoveryWindow {
			if err := send(); errors.Is(err, errStalled) {
				// The connection's pending limit (shared with every
				// session of the process) is full: backpressure, not a
				// failure. Take an acknowledgement of ours, or, with
				// none in flight, send again (it waits for room).
				break
			} else if err != nil {
				return err
			}
		}
		if len(inflight) > 0 {
			if err := done(); err != nil {
				return err
			}
		}
	}
	return nil
}

// publish sends one effect asynchronously with its id; the checkpoint
// waits for its ack.
func (s *session) publish(ctx context.Context, e reconcile.Effect) error {
	if len(s.pending) >= 1024 {
		if err := s.awaitAcks(ctx); err != nil {
			return err
		}
	}
	if err := s.p.lost(); err != nil {
		return err
	}
	r := s.p.r
	id := store.EffectMsgID(r.key, e.ID())
	opts := r.publishOpts(e, id)
	var span trace.Span
	if r.tr != nil {
		var sctx context.Context
		sctx, span = r.tr.Start(ctx, "publish "+string(e.Kind), trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(tracing.Node.String(e.Node), tracing.Kind.String(string(e.Kind)), tracing.SeqAttr(tracing.Cause, e.Cause)))
		opts = append(opts, store.WithTraceparent(tracing.Traceparent(sctx)))
	}
	f, err := r.pub.AppendAsync(ctx, e.Node, e.Payload, opts...)
	if err != nil && span != nil {
		span.SetStatus(codes.Error, err.Error())
		span.End()
	}
	if store.Permanent(err) {
		return s.poisoned(ctx, e, err)
	}
	if err != nil {
		return fmt.Errorf("publish %s: %w", id, err)
	}
	s.remember(f.Msg())
	pa := pendingAck{f: f, sent: time.Now(), e: e}
	if span != nil {
		pa.ok, pa.errc = relayAck(ctx, f, span)
	}
	s.pending = append(s.pending, pa)
	s.p.r.logJournal(e)
	s.effectSent(id)
	return nil
}

// readHeartbeat is the idle heartbeat of a partition's consumer. Two
// missed heartbeats end its tail (store.TailConfig.EndOnLoss): when the
// server holding the consumer stops, whichever server of the cluster it
// is, the session reads on through a new consumer (refollow) after ~2 s.
const readHeartbeat = time.Second

// ackTimeout bounds each wait for the acknowledgement of an effect, and
// each attempt of a checkpoint's snapshot write (10,000 states take ~70
// ms on a quiet machine; an attempt that stored part of the write is
// followed by another, see retryWrite). An async
// publish's future never resolves when its ack is lost (its server
// stopped before answering, on a cluster changing leaders) unless the
// JetStream context sets a publish-async timeout, which the caller's may
// not: the session sends it again (pubride.go) instead.
const ackTimeout = 5 * time.Second

// refollow starts a new tail from the event after the last one folded,
// after an election or the loss of the tail's consumer. Creating a
// consumer needs the cluster's meta leader too, which a crash may have
// taken with it, and a request sent while there is none is never
// answered: refollow asks as every other ask of the meta leader does
// (store.AskAgainWhile, store.AskAgain's pacing), one attempt at a time,
// each bounded by 1 s doubling to 5 s, asking again after any failure
// (a missing stream too: JetStream restarting in the process) until
// followRideOut has passed. It never holds more than one creation of the
// partition's consumer outstanding: before, an attempt unanswered after
// 500 ms had another started beside it, up to ten per partition, and
// every one the server answered late left a consumer until its
// inactivity threshold (160 creations in flight for 16 partitions
// during one election). A closed connection, or the server denying the
// creation, ends it at once; past followRideOut the last error is
// returned (a *store.NoLeaderError when nothing or "no leader"
// answered), and the session ends and restarts, logged. A refollow
// still without a consumer after followTimeout says so once, at warn
// level.
func (s *session) refollow(ctx context.Context, follow func(context.Context, uint64) (*store.Tail, error)) (*store.Tail, error) {
	defer s.enter(&stepFollow)()
	from, started := s.folded+1, time.Now()
	var (
		mu      sync.Mutex
		asks    int
		lastErr error
	)
	warn := time.AfterFunc(followTimeout, func() {
		mu.Lock()
		n, err := asks, lastErr
		mu.Unlock()
		s.p.r.log.Warn("partition read has no consumer yet: asking again", "partition", s.p.id, "from", from,
			"waited", time.Since(started).Round(time.Millisecond), "asks", n, "err", err)
	})
	defer warn.Stop()
	rctx, cancel := context.WithTimeout(ctx, s.p.r.cfg.tuning.followRide())
	defer cancel()
	again := func(err error) bool { return !errors.Is(err, nats.ErrConnectionClosed) }
	return store.AskAgainWhile(rctx, s.p.r.js, s.p.r.cfg.Stream.Name, again, func(actx context.Context) (*store.Tail, error) {
		mu.Lock()
		asks++
		mu.Unlock()
		t, err := follow(actx, from)
		if err != nil {
			mu.Lock()
			lastErr = err
			mu.Unlock()
		}
		return t, err
	})
}

// followTimeout: a refollow still without a consumer after it says so
// (refollow), the client's default API timeout.
const followTimeout = 5 * time.Second

// followRideOut bounds how long refollow asks: an election's length
// (electionRideOut). A Reconciler's own in tests (tuning).
const followRideOut = electionRideOut

// tuning is a Reconciler's own value of the bounds above that tests
// shorten or lengthen (ReconcilerConfig.tuning, set through
// export_*_test.go): each test's reconciler has its own, so that a test
// that changes one runs beside others (a package variable set by one
// test was read by every other test's sessions). A zero field is the
// package's bound.
type tuning struct {
	readStallAfter time.Duration
	followRideOut  time.Duration
	prepareWindow  int
	leftScanMax    uint64
	leftScanSet    bool // leftScanMax is set: 0 is a bound
	// publishPending bounds the effects awaiting their answers at once,
	// every session's (store.WithMaxPending); 0: the store's default.
	publishPending int
}

func (t tuning) readStall() time.Duration {
	if t.readStallAfter > 0 {
		return t.readStallAfter
	}
	return readStallAfter
}

func (t tuning) followRide() time.Duration {
	if t.followRideOut > 0 {
		return t.followRideOut
	}
	return followRideOut
}

func (t tuning) prepare() int {
	if t.prepareWindow > 0 {
		return t.prepareWindow
	}
	return prepareWindow
}

func (t tuning) leftScan() uint64 {
	if t.leftScanSet {
		return t.leftScanMax
	}
	return leftScanMax
}

// snapshotAttempt bounds a snapshot write's first attempt; a retry after
// an election waits twice as long, up to ackTimeout.
const snapshotAttempt = time.Second

// retryWrite runs write with a deadline of snapshotAttempt; when it fails
// for want of an answer, it waits for the stream and the snapshot bucket
// to have leaders and tries again, each attempt's deadline doubled up to
// ackTimeout, for at most electionRideOut in all (without an election,
// until an attempt of ackTimeout failed). An attempt that timed out after
// storing part of the write (write reports progressed: some of its puts
// were acknowledged) is a slow server, not a missing one: the next
// attempt starts the ride-out afresh, as long as the lease holds. A cold
// refold's checkpoint puts thousands of states a partition, every
// partition at once; on a starved machine such a write outlasted the
// ride-out while acknowledgements kept arriving, and the session ended
// and refolded from its snapshot (issue 27). Other errors (a conflict:
// another writer; a closed connection) end it at once.
func (s *session) retryWrite(ctx context.Context, write func(context.Context) (progressed bool, err error)) error {
	return s.p.retry(ctx, write)
}

// leaderRead runs read, a read a session's decision rests on from the
// stream's or the snapshot bucket's leader (store.LeaderReads, a stream
// info), riding out an election as a checkpoint's write does (retry):
// without a leader such a read gets no answer, or the server's "cluster
// not available", where a direct get, which any replica answers, got one
// before; the session ended and refolded from its snapshot (reviewer's
// finding). Each attempt is bounded by snapshotAttempt, doubled up to
// ackTimeout; a read that fails for want of an answer waits for the
// leaders and is tried again, for at most electionRideOut, the lease
// checked before each retry. Other errors are returned at once.
func (p *partition) leaderRead(ctx context.Context, read func(context.Context) error) error {
	return p.retry(ctx, func(ctx context.Context) (bool, error) { return false, read(ctx) })
}

// retry is retryWrite's loop, for a write or a read (leaderRead) of the
// partition. Once ctx ends, an unanswered attempt's error gives way to
// ctx's cause (stoppedRetry): a stop, not a timeout.
func (p *partition) retry(ctx context.Context, write func(context.Context) (progressed bool, err error)) error {
	started := time.Now()
	attempt := snapshotAttempt
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(electionPollMin),
		backoff.WithMaxInterval(electionPollMax), backoff.WithMaxElapsedTime(0))
	for {
		actx, cancel := context.WithTimeout(ctx, attempt)
		progressed, err := write(actx)
		timedOut := actx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
		cancel()
		if err != nil && ctx.Err() != nil && (store.Unanswered(err) || errors.Is(err, context.Canceled)) {
			// Unanswered, or cut by ctx's end itself (a request whose
			// context was cancelled returns context.Canceled, not the
			// cause: a lost lease's loss read as a stop's).
			return stoppedRetry(ctx, err)
		}
		if err == nil || !store.Unanswered(err) {
			return err
		}
		if progressed {
			if err := p.lost(); err != nil {
				return err
			}
			started = time.Now()
			attempt = min(2*attempt, ackTimeout)
			continue
		}
		if time.Since(started) > electionRideOut || p.giveUp(timedOut, attempt) {
			return err
		}
		if !p.awaitLeaders(ctx) {
			if timedOut && attempt >= ackTimeout {
				return err // no election: slow, as before, past ackTimeout
			}
			// Refused at once (no responders, no leader as the server
			// says) while the leaders look present, or a short attempt
			// timed out: a pause, growing, before the next.
			select {
			case <-ctx.Done():
				return stoppedRetry(ctx, err)
			case <-time.After(b.NextBackOff()):
			}
		}
		if err := p.lost(); err != nil {
			return err
		}
		attempt = min(2*attempt, ackTimeout)
	}
}

// stoppedRetry is retry's error when ctx ends while its last attempt, err,
// went unanswered or was cut by that end, or between two attempts: ctx's
// cause (context.Canceled
// for a stop), naming err. The end is ctx's, whatever the last attempt's
// error: on a loaded machine a read of a session's start (the partition's
// holdsEffects, its stream bounds) timed out its first attempt of
// snapshotAttempt behind the server's queue of JetStream API requests,
// the stop came before the next attempt's answer, and the session ended
// with "context deadline exceeded": run took that for a failure and the
// clean stop left the partition Unsaved (TestUnsavedSnapshots, 6 of 40
// runs under load, before and after issue 27's cold-start change). The
// attempt's error is kept as text only: the error is not Unanswered, so
// no caller waits for an answer that ctx no longer allows.
func stoppedRetry(ctx context.Context, err error) error {
	return fmt.Errorf("%w (the last attempt: %v)", context.Cause(ctx), err)
}

// awaitAcks waits for every effect sent to be acknowledged. The live
// path's effects are not fenced: those left unanswered (resendable: the
// client's server went away, a leader was lost) are sent again, in order,
// with their message ids, once every answer of the pass is in (those
// still missing ackTimeout after the first unanswered one count as
// unanswered) and the ride-out allows it (rideAgain); a copy stored
// before the loss is then a duplicate within the stream's dedup window.
// Two rules keep that sound: an effect is sent again only within half the
// dedup window of its first send (else the session ends, as before, and
// its restart's recovery rule decides); and a plan a later plan of its
// node was stored behind in the pass (sent while the client reconnected,
// before the plan's new send) is not sent again: a superseded plan is
// never stored after a newer one (the recovery rule's).
func (s *session) awaitAcks(ctx context.Context) error {
	if len(s.pending) == 0 {
		return nil
	}
	defer s.enter(&stepAcks)()
	r := s.p.r
	m := r.m
	timer := time.NewTimer(ackTimeout)
	defer timer.Stop()
	window := r.cfg.Stream.Duplicates
	if window <= 0 {
		window = store.DefaultDuplicates
	}
	type lost struct {
		pa   pendingAck
		i    int   // its place in the pass
		err  error // its answer
		done bool  // answered after all (take)
	}
	var (
		ride pubRide
		// planAt holds each node's last plan acknowledged in a pass,
		// by place.
		planAt map[string]int
	)
	// take takes pa's answer (ack, or err), the pass's i-th; not ok when
	// it is unanswered (resendable), err the session's when it ends.
	take := func(pa pendingAck, i int, ack *jetstream.PubAck, err error) (ok bool, _ error) {
		switch {
		case err == nil:
			ride.answered()
			m.Publishing.Observe(time.Since(pa.sent).Seconds())
			if !ack.Duplicate || pa.resent {
				m.Effects.WithLabelValues(string(pa.e.Kind)).Inc()
			}
			if pa.e.Kind == events.KindPlan {
				if planAt == nil {
					planAt = map[string]int{}
				}
				planAt[pa.e.Node] = max(planAt[pa.e.Node], i)
			}
		case store.Permanent(err):
			ride.answered()
			return true, s.poisoned(ctx, pa.e, err)
		case resendable(err):
			return false, nil
		default:
			return false, fmt.Errorf("publish %s: %w", pa.f.Msg().Header.Get(jetstream.MsgIDHeader), store.ServerError(err))
		}
		return true, nil
	}
	for len(s.pending) > 0 {
		clear(planAt)
		var (
			again   []lost
			cause   error
			expired bool // ackTimeout passed since the pass's first unanswered one
		)
		for i, pa := range s.pending {
			if !expired && again == nil {
				timer.Reset(ackTimeout)
			}
			ack, err, werr := s.answerOf(ctx, pa, expired, timer)
			if werr != nil {
				return werr
			}
			expired = expired || errors.Is(err, errNoAck)
			// take's error is the session's; err, the answer, is what
			// the ride-out acts on (it was shadowed: every lost answer
			// recorded nil, its cause said "%!w(<nil>)", and a timed-out
			// one was sent again without its late answer taken first).
			ok, terr := take(pa, i, ack, err)
			if terr != nil {
				return terr
			}
			if !ok {
				again = append(again, lost{pa: pa, i: i, err: err})
				if cause == nil {
					cause = fmt.Errorf("publish %s: %w", pa.f.Msg().Header.Get(jetstream.MsgIDHeader), err)
				}
			}
		}
		clear(s.pending)
		s.pending = s.pending[:0]
		if len(again) == 0 {
			break
		}
		if err := s.rideAgain(ctx, &ride, cause, len(again)); err != nil {
			return err
		}
		// Those that had no answer in time may have been sent while the
		// client reconnected, and stored once it had: their answers
		// come now. Sending an earlier one again before taking them
		// could store it after them.
		timer.Reset(ackTimeout)
		expired = false
		for k := range again {
			u := &again[k]
			if !errors.Is(u.err, errNoAck) {
				continue
			}
			ack, err, werr := s.answerOf(ctx, u.pa, expired, timer)
			if werr != nil {
				return werr
			}
			if errors.Is(err, errNoAck) {
				expired = true // the rest are taken only if come
				continue
			}
			ok, serr := take(u.pa, u.i, ack, err)
			if serr != nil {
				return serr
			}
			u.done, u.err = ok, err
		}
		var refused error
		for _, u := range again {
			pa := u.pa
			if u.done {
				continue
			}
			if at, ok := planAt[pa.e.Node]; ok && pa.e.Kind == events.KindPlan && at > u.i {
				continue // superseded by a plan stored after it
			}
			if time.Since(pa.sent) > window/2 {
				return fmt.Errorf("%w (not sent again: first sent %s ago, the dedup window is %s)",
					cause, time.Since(pa.sent).Round(time.Millisecond), window)
			}
			if refused == nil {
				f, err := r.pub.ResendMsgAsync(pa.f.Msg())
				if err == nil {
					s.pending = append(s.pending, pendingAck{f: f, sent: pa.sent, e: pa.e, resent: true})
					continue
				}
				refused = err
			}
			// Unsent: the refusal is its answer (pa.f holds its
			// message).
			pa.ok, pa.errc = failedSend(refused)
			s.pending = append(s.pending, pa)
		}
	}
	return nil
}

// answerOf takes pa's answer for a pass of awaitAcks: before the pass's
// wait expired, awaitAck's wait, bounded by timer; after, only an answer
// already come, errNoAck (pubErr) when none has. err is ctx's when it
// ends first.
func (s *session) answerOf(ctx context.Context, pa pendingAck, expired bool, timer *time.Timer) (ack *jetstream.PubAck, pubErr, err error) {
	okc, errc := pa.acked()
	if !expired {
		return s.awaitAck(ctx, okc, errc, timer)
	}
	select {
	case ack = <-okc:
		return ack, nil, nil
	case pubErr = <-errc:
		return nil, pubErr, nil
	default:
		return nil, errNoAck, nil
	}
}

// awaitAck waits for the answer to one publish: its acknowledgement on
// ok, or its error on errc (pubErr, the server's answer, for the caller
// to judge); timer, armed by the caller, bounds the wait, and when it
// fires pubErr is errNoAck (resendable: the caller rides it out). err is
// ctx's when it ends first.
func (s *session) awaitAck(ctx context.Context, ok <-chan *jetstream.PubAck, errc <-chan error, timer *time.Timer) (ack *jetstream.PubAck, pubErr, err error) {
	select {
	case ack = <-ok:
		return ack, nil, nil
	case pubErr = <-errc:
		return nil, pubErr, nil
	case <-timer.C:
		return nil, fmt.Errorf("%w within %s", errNoAck, ackTimeout), nil
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// recoveryCheckpointDue reports whether a recovering session should
// checkpoint now: it folded events since its last checkpoint, every
// effect it deferred was seen stored (or superseded), and
// RecoveryCheckpointInterval has passed since its last checkpoint (or
// its start). Such a checkpoint is a steady state's: every effect caused
// at or before it is stored, so a successor resuming from it neither
// loses nor doubles one, and needs nothing of this session's bookkeeping
// (docs/architecture.md, "Checkpoints during a recovery"). A lease lost
// mid-catch-up then costs the refold since the last one, not the
// partition's whole refold (issue 27).
func (s *session) recoveryCheckpointDue() bool {
	return s.since > 0 && s.rec.settled() && time.Since(s.checkpointed) >= s.p.r.cfg.RecoveryCheckpointInterval
}

// stateArena hands a checkpoint the buffers it encodes its states into,
// one after another: chunks of at most arenaChunk bytes, each sized from
// the states left to encode times the last checkpoint's average state
// (arenaGuess before the first). One buffer grown by append for every
// state of a checkpoint was reallocated about 1.25 times over at each
// growth past its capacity: a cold refold's checkpoint (its only one,
// with no average yet) allocated about five times the states it encoded,
// 1.1 GB at 100,000 nodes, and the collection that followed marked the
// whole heap of states (issue 27, a cold refold's cost per node).
type stateArena struct {
	buf  []byte
	avg  int // the last checkpoint's average state, bytes; 0: unknown
	left int // states still to encode
}

// arenaChunk bounds an arena's chunk; arenaGuess is the state size a
// session's first checkpoint assumes (the bench's mix: ~2.2 KB).
const (
	arenaChunk = 1 << 20
	arenaGuess = 2 << 10
)

// room returns the buffer the next state is appended to: the current
// chunk while it has room for twice the average state, else a new one.
// A state larger than the room left grows the chunk by append, once.
func (a *stateArena) room() []byte {
	avg := a.avg
	if avg <= 0 {
		avg = arenaGuess
	}
	if cap(a.buf)-len(a.buf) < 2*avg {
		a.buf = make([]byte, 0, min(arenaChunk, max(2*avg, a.left*(avg+avg/8))))
	}
	return a.buf
}

// took notes the buffer room returned, with one more state appended.
func (a *stateArena) took(grown []byte) {
	a.buf = grown
	a.left--
}

// dirtyNode is a node folded since its state was last put: its state,
// the sequence of the first event folded since, and the checkpoint
// generation that event came in.
type dirtyNode struct {
	st    *reconcile.State
	first uint64
	gen   uint64
}

// stateAge is how many checkpoints a node's changed state may wait before
// a checkpoint puts it (docs/architecture.md, "Live: states put by age").
// A state changed after checkpoint N is put at checkpoint N+stateAge, and
// a checkpoint that leaves states unwritten stores the sequence before the
// first event of those still waiting, all changed after checkpoint
// N+1-stateAge: a restart refolds at most the events since the stateAge-th
// last checkpoint, at most stateAge × SnapshotEvery messages of a
// partition (4,000) and about stateAge × SnapshotInterval (4 s) of its
// input; with a live checkpoint's write still in flight (checkpointLive),
// one period more, each at most 2 × SnapshotEvery. Put at every checkpoint, a node that changes about once a second
// was written about once an event on the live path (0.17–0.35 puts an
// input, issue 27).
const stateAge = 4

// checkpointNow makes the stored snapshot cover more of the events
// folded: effects acknowledged first, then node states, then the
// partition's sequence. With full, or for a node whose state has waited
// stateAge checkpoints, the node's changed state is put; any other
// changed state waits, and the stored checkpoint is then the sequence
// before the first event of the waiting nodes (every node's stored state
// covers every event of it up to there, so a restart's refold from it
// absorbs the rest: DESIGN.md §5.3's recovery rule sees every effect those
// events caused). Each node state is written only if its key is still at
// the revision this session last saw: a second writer of the partition (a
// stale former owner, or a new one) makes it fail with ErrConflict, and
// the session restarts from the snapshot, unless the key then holds a
// state of the node this session's covers (adopt: a former session's put
// that landed late), which it puts over. So a stored node state only
// ever moves forward, and a stored checkpoint never claims more than its
// nodes' states cover.
//
// While recovering it writes only when every effect deferred so far was
// seen stored (recovery.settled), and every effect earlyPub holds is
// published and acknowledged (drainEarly), and then forgets them: none is
// left to publish for the causes the checkpoint covers.
//
// It writes in line: a live checkpoint still being written
// (checkpointLive) is waited for first, and one due after it is taken
// into this one.
func (s *session) checkpointNow(ctx context.Context, full bool) error {
	defer s.enter(&stepCheckpoint)()
	if err := s.awaitWrite(ctx); err != nil {
		return err
	}
	full = full || s.dueFull
	s.due, s.dueFull = false, false
	w, err := s.captureCheckpoint(ctx, full)
	if w == nil || err != nil {
		return err
	}
	w.err = s.writeCheckpoint(ctx, w)
	return s.finishCheckpoint(w)
}

// checkpointLive is checkpointNow on the live path (not recovering),
// whose writes go on while the fold does (docs/architecture.md, "The
// live path (issue 27)": a knock's p99 waited behind its partition's
// checkpoint). The effects' acknowledgements are awaited and the due
// states encoded in line, as before (every effect a state put covers is
// stored first); the states' puts and then the sequence are written by a
// goroutine of their own, and the session's loop takes the outcome
// (takeWrite). One write at a time: a checkpoint due while the previous
// one is being written is noted (due) and taken once that one is stored;
// the fold waits for it only when 2 × SnapshotEvery events were folded
// since the last checkpoint was taken, which bounds a restart's refold
// as before, with one period more.
func (s *session) checkpointLive(ctx context.Context, full bool) error {
	if s.writing != nil {
		s.due, s.dueFull = true, s.dueFull || full
		if s.since < 2*s.p.r.cfg.SnapshotEvery {
			return nil
		}
		if err := s.awaitWrite(ctx); err != nil {
			return err
		}
	}
	full = full || s.dueFull
	s.due, s.dueFull = false, false
	w, err := s.captureCheckpoint(ctx, full)
	if w == nil || err != nil {
		return err
	}
	s.since = 0 // from here, the events folded after this capture
	w.done = make(chan struct{})
	s.writing = w
	go func() {
		defer close(w.done)
		w.err = s.writeCheckpoint(ctx, w)
	}()
	return nil
}

// writeDone is closed when the live checkpoint being written is stored or
// has failed; nil (never ready) when none is being written.
func (s *session) writeDone() <-chan struct{} {
	if s.writing == nil {
		return nil
	}
	return s.writing.done
}

// takeWrite takes the outcome of the live checkpoint whose write ended
// (writeDone closed).
func (s *session) takeWrite() error {
	w := s.writing
	s.writing = nil
	return s.finishCheckpoint(w)
}

// awaitWrite waits for the live checkpoint being written, if any, and
// takes its outcome: its error, or ctx's when ctx ends first (the write
// is then still in flight: abandonWrite).
func (s *session) awaitWrite(ctx context.Context) error {
	if s.writing == nil {
		return nil
	}
	defer s.enter(&stepWrite)()
	select {
	case <-s.writing.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.takeWrite()
}

// errSessionOver cancels a live checkpoint's write when its session ends
// before it is stored.
var errSessionOver = errors.New("partition session over")

// abandonWrite ends the session's part in a live checkpoint still being
// written: cancel (of the session's work context) stops the write, and it
// returns once the write's goroutine has. It does not wait for the
// puts: state puts already sent when cancel came may still be stored
// after the partition's next session read the bucket. Each is fenced on
// the revision this session last saw, so it cannot overwrite a newer
// state; the next session's put of that node then fails its fence, and
// that session reads the key again and puts over the older state
// (adopt) instead of starting again (docs/architecture.md, "The live
// path (issue 27)").
func (s *session) abandonWrite(cancel func()) {
	if s.writing == nil {
		return
	}
	cancel()
	<-s.writing.done
	s.writing = nil
}

// checkpointWrite is one checkpoint between its capture and its outcome:
// what is written, and by whom (the session, or for a live checkpoint a
// goroutine of its own, which touches nothing of the session's but this).
type checkpointWrite struct {
	states, summaries map[string][]byte
	// revs holds each put node's revision as last seen, and then as
	// stored (Snapshots.PutSummarizedAt updates it); seqs each put
	// state's last sequence folded (reconcile.State.Seq: see adopt).
	revs, seqs map[string]uint64
	// ck is the sequence to store once every state is; stored only when
	// past base, the checkpoint stored when it was taken.
	ck, base uint64
	// ckRev is the checkpoint key's revision as last seen, and then as
	// stored (putCheckpoint).
	ckRev  uint64
	folded uint64 // the last sequence folded when it was taken
	done   chan struct{}
	err    error
}

// captureCheckpoint takes a checkpoint: it waits for every effect sent to
// be acknowledged, chooses the states to put (full, or aged stateAge
// checkpoints) and the sequence it can claim, and encodes the states. The
// chosen nodes leave dirty: a failed write ends the session, which starts
// again from the stored snapshot. Nil when there is nothing to write.
func (s *session) captureCheckpoint(ctx context.Context, full bool) (*checkpointWrite, error) {
	if (s.recovering && !s.rec.settled()) || (s.folded == s.checkpoint && len(s.dirty) == 0) {
		return nil, nil
	}
	p := s.p
	// Regions of a Go execution trace (BenchmarkKnockLatency's tail was
	// found in them): nothing when no trace is being taken.
	defer rtrace.StartRegion(ctx, "checkpoint capture").End()
	rtrace.Log(ctx, "partition", strconv.Itoa(p.id))
	if err := s.awaitAcks(ctx); err != nil {
		return nil, err
	}
	if s.recovering && s.early != nil {
		// The effects published during the read are stored before a
		// checkpoint covers their causes.
		if err := s.drainEarly(ctx); err != nil {
			return nil, err
		}
	}
	if err := p.lost(); err != nil {
		return nil, err
	}
	s.gen++
	w := &checkpointWrite{base: s.checkpoint, folded: s.folded, ckRev: s.ckRev}
	// ck is what the checkpoint can claim: the sequence before the first
	// event of every node whose state waits.
	w.ck = s.folded
	put := make([]string, 0, len(s.dirty))
	for node, d := range s.dirty {
		if full || s.gen-d.gen >= stateAge {
			put = append(put, node)
		} else {
			w.ck = min(w.ck, d.first-1)
		}
	}
	if len(put) > 0 {
		sctx, cancel := context.WithTimeout(ctx, ackTimeout)
		defer cancel()
		w.states = make(map[string][]byte, len(put))
		w.summaries = make(map[string][]byte, len(put))
		w.revs = make(map[string]uint64, len(put))
		w.seqs = make(map[string]uint64, len(put))
		// The states are encoded into shared buffers (stateArena), sized
		// from the last checkpoint's average: encoding each changed
		// state (2–3 KB) into buffers of its own, copied twice, was 9 %
		// of a live reconciler's CPU (issue 27). New ones each
		// checkpoint, so that no put still in flight can see its bytes
		// change.
		arena := stateArena{avg: s.stateAvg, left: len(put)}
		encoded := 0
		for _, node := range put {
			buf := arena.room()
			b, sum, grown, err := s.snapshotOf(sctx, node, s.dirty[node].st, buf)
			if err != nil {
				return nil, err
			}
			arena.took(grown)
			encoded += len(b)
			w.states[node] = b
			if sum != nil {
				w.summaries[node] = sum
			}
			w.revs[node] = s.revs[node]
			w.seqs[node] = s.dirty[node].st.Seq
		}
		if n := len(w.states); n > 0 {
			s.stateAvg = encoded / n
		}
	}
	for _, node := range put {
		delete(s.dirty, node)
	}
	return w, nil
}

// writeCheckpoint puts w's states, then, once every one is acknowledged
// and the lease still held, its sequence. It reads nothing of the
// session's but its partition.
func (s *session) writeCheckpoint(ctx context.Context, w *checkpointWrite) error {
	r, p := s.p.r, s.p
	defer rtrace.StartRegion(ctx, "checkpoint write").End()
	rtrace.Log(ctx, "partition", strconv.Itoa(p.id))
	// Each write is tried for snapshotAttempt, then, while the bucket
	// elects a leader, again once it has one (issue 24): a write sent
	// into an election gets no answer, and waiting out ackTimeout kept
	// the partition from reading seconds after the bucket answered again.
	// Node states acknowledged by a failed attempt are not written twice
	// (PutNodesAt moves their revisions); one whose acknowledgement was
	// lost conflicts, and so does one a former session's put overtook:
	// adopt reads those keys again and puts over what it may.
	states := w.states
	if err := s.retryWrite(ctx, func(ctx context.Context) (progressed bool, err error) {
		left := len(states)
		defer func() { progressed = len(states) < left }()
		for round := 0; ; round++ {
			if len(states) == 0 {
				return false, nil
			}
			before := make(map[string]uint64, len(states))
			for node := range states {
				before[node] = w.revs[node]
			}
			err := r.snaps.PutSummarizedAt(ctx, p.id, states, w.summaries, w.revs)
			for node, rev := range before {
				if w.revs[node] != rev {
					delete(states, node) // written
				}
			}
			var conflict *store.NodeConflictError
			if !errors.As(err, &conflict) || round == adoptRounds {
				return false, err
			}
			if err := s.adopt(ctx, w, conflict); err != nil {
				return false, err
			}
		}
	}); err != nil {
		return err
	}
	if err := p.lost(); err != nil {
		return err
	}
	if w.ck > w.base {
		return s.retryWrite(ctx, func(ctx context.Context) (bool, error) {
			return false, s.putCheckpoint(ctx, w)
		})
	}
	return nil
}

// putCheckpoint puts w's sequence, fenced on the checkpoint key's
// revision as last seen (w.ckRev, moved to the new one): a put of a
// former session of the partition, sent before it ended or lost its
// lease, that lands after this session stored a checkpoint fails instead
// of moving the checkpoint back. A put that fails its fence (such a put
// landed after this session read the key, or a put of its own whose
// acknowledgement was lost) reads the key again from the bucket's leader
// and, with the lease still held, puts over it at the revision read:
// every state is stored before its checkpoint's sequence and a stored
// state only moves forward (adopt), so whichever sequence was there is
// covered, and this one is too (docs/architecture.md, "The live path
// (issue 27)").
func (s *session) putCheckpoint(ctx context.Context, w *checkpointWrite) error {
	r, p := s.p.r, s.p
	rev, err := r.snaps.PutCheckpointAt(ctx, p.id, w.ck, w.ckRev)
	if errors.Is(err, store.ErrConflict) {
		_, cur, rerr := r.snaps.CheckpointRev(ctx, p.id)
		if rerr != nil {
			// %w twice: a re-read that got no answer (an election) is
			// ridden out by the retryWrite this put runs in.
			return fmt.Errorf("%w (reading it again: %w)", err, rerr)
		}
		if err := p.lost(); err != nil {
			return err
		}
		rev, err = r.snaps.PutCheckpointAt(ctx, p.id, w.ck, cur)
	}
	if err != nil {
		return err
	}
	w.ckRev = rev
	return nil
}

// adoptRounds bounds how many times one write of a checkpoint reads
// conflicting keys again and puts over them (adopt): a second writer
// still writing the partition's keys makes it fail at last, and the
// session restart from its snapshot, as any conflict did before.
const adoptRounds = 2

// adopt reads again, from the bucket's leader, the keys of conflict's
// nodes, whose puts failed their revision fence, and takes each key's
// revision as the one to put at when the key holds a state (or a too-big
// marker) of that node whose last sequence folded is at most that of
// the state w puts: its state covers every event the stored one does, so
// putting it over that moves the node's stored state forward, as a put
// at the revision first seen would have, and the checkpoint's sequence,
// put after, is still covered. That is the write of a session of this
// partition that landed after this one read the key: a live checkpoint's
// puts sent before its session ended on an error (abandonWrite), or a
// put of this write whose acknowledgement was lost. Anything else there
// (a newer state: a second writer ahead of this one; a deletion; a
// state it cannot read) returns conflict: the session restarts from its
// snapshot (docs/architecture.md, "The live path (issue 27)").
func (s *session) adopt(ctx context.Context, w *checkpointWrite, conflict *store.NodeConflictError) error {
	p := s.p
	for _, node := range conflict.Nodes {
		b, rev, err := p.r.snaps.NodeAtLeader(ctx, p.id, node)
		if err != nil {
			// %w twice: a re-read that got no answer (an election) is
			// ridden out by the retryWrite this write runs in.
			return fmt.Errorf("%w (reading it again: %w)", conflict, err)
		}
		seq, ok := storedSeq(node, b)
		if !ok || seq > w.seqs[node] {
			return conflict
		}
		p.r.log.Debug("snapshot put over an older state of the partition's", "partition", p.id, "node", node,
			"stored_seq", seq, "seq", w.seqs[node], "revision", rev)
		w.revs[node] = rev
	}
	return p.lost()
}

// storedSeq returns the last sequence folded of node's stored snapshot b
// (a state, or a too-big marker); false when b is none (a deleted key),
// of another node, or unreadable by this build.
func storedSeq(node string, b []byte) (uint64, bool) {
	if b == nil {
		return 0, false
	}
	if m, ok := markerOf(b); ok {
		return m.Seq, m.Node == node
	}
	st, err := reconcile.UnmarshalState(b)
	if err != nil {
		return 0, false
	}
	return st.Seq, st.Node == node
}

// finishCheckpoint takes w's outcome into the session: the put nodes'
// new revisions (also of a failed write: a put acknowledged is stored),
// and, when it was stored, its sequence.
func (s *session) finishCheckpoint(w *checkpointWrite) error {
	r, p := s.p.r, s.p
	for node, rev := range w.revs {
		s.revs[node] = rev
	}
	s.ckRev = w.ckRev
	if w.err != nil {
		return w.err
	}
	s.checkpoint = max(s.checkpoint, w.ck)
	if w.done == nil {
		s.since = 0 // written in line: nothing was folded since its capture
	}
	s.checkpointed = time.Now()
	if s.recovering {
		s.rec.forget()
		r.log.Debug("partition checkpointed during its recovery", "partition", p.id, "checkpoint", s.checkpoint, "recovering_to", s.lastAtStart)
	}
	r.m.Checkpoints.Inc()
	return fault(r.cfg.Faults.AfterCheckpoint, p.id, w.folded)
}
