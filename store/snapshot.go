package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/meshfold/meshfold/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoSnapshot: the bucket holds no state for that node.
var ErrNoSnapshot = errors.New("store: no snapshot")

// SnapshotBucketSuffix is appended to the stream name to name the
// snapshot bucket: MESH → MESH_SNAPSHOTS.
const SnapshotBucketSuffix = "_SNAPSHOTS"

// putWindow bounds the async puts of [Snapshots.PutNodes] in flight
// through one Snapshots, across partitions, below the client's default
// limit of 4000 pending async publishes.
const putWindow = 1024

// Snapshots stores folded node states and partition checkpoints in a KV
// bucket (file storage, history 1, the stream's replica count):
//
//	node.<partition>.<node>   a node's state, as the reconciler encodes it
//	checkpoint.<partition>    the stream sequence, decimal, up to which
//	                          every state of that partition is folded
//
// Write a partition's node states, wait for them, then its checkpoint
// (PutNodes, then PutCheckpoint): a crash in between leaves states newer
// than the checkpoint, which a refold from the checkpoint absorbs. It is
// safe for concurrent use.
type Snapshots struct {
	js jetstream.JetStream
	// pub is the context the puts of PutSummarizedAt (PutNodesAt) and
	// PutCheckpointAt are published through: js unless PublishOn set
	// another.
	pub jetstream.JetStream
	// acks, when PublishThrough set it, sends the puts of
	// PutSummarizedAt instead of pub's PublishMsgAsync: a Publisher's
	// asynchronous publisher, on its connection.
	acks *acks
	kv   jetstream.KeyValue
	pre  string // subject prefix of a put, key appended
	subj events.Subjects
	// slots holds one token per put in flight: at most putWindow
	// across every partition writing through this Snapshots.
	slots chan struct{}

	streamMu sync.Mutex
	st       jetstream.Stream // the bucket's stream, once looked up
}

// ErrNoSnapshots: the snapshot bucket does not exist: no reconciler has
// checkpointed yet.
var ErrNoSnapshots = errors.New("store: no snapshot bucket: no reconciler has checkpointed yet")

// OpenSnapshots opens the snapshot bucket of streamCfg's stream (named
// streamCfg.Name + "_SNAPSHOTS"), creating it with streamCfg's replica
// count when it does not exist. Pass the effective configuration
// [EnsureStream] returned. An existing bucket is opened as it is.
//
// Errors: the bucket's lookup or creation failing.
func OpenSnapshots(ctx context.Context, js jetstream.JetStream, streamCfg StreamConfig) (*Snapshots, error) {
	return openSnapshots(ctx, js, streamCfg, true)
}

// FindSnapshots opens the snapshot bucket of streamCfg's stream without
// creating it: what a reader (`meshfold state`, `fleet`, the console)
// uses, which must not make one.
//
// Errors: an error wrapping [ErrNoSnapshots] when the bucket does not
// exist; the lookup's errors.
func FindSnapshots(ctx context.Context, js jetstream.JetStream, streamCfg StreamConfig) (*Snapshots, error) {
	return openSnapshots(ctx, js, streamCfg, false)
}

func openSnapshots(ctx context.Context, js jetstream.JetStream, streamCfg StreamConfig, create bool) (*Snapshots, error) {
	cfg := streamCfg.WithDefaults()
	bucket := cfg.Name + SnapshotBucketSuffix
	// Through openKV, as the other buckets: a creation answered "no
	// suitable peers" (10005) on a cluster just formed, or a lookup a
	// killed leader never answers, is asked again within ctx.
	kv, err := openKV(ctx, js, create, jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: "meshfold snapshots of stream " + cfg.Name + ": node.<p>.<node> states, checkpoint.<p> sequences",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if !create && errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("bucket %s: %w", bucket, ErrNoSnapshots)
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot bucket %s: %w", bucket, err)
	}
	// The subject a put goes to, as KeyValue.Put builds it: async puts
	// are publishes on it.
	pre := "$KV." + bucket + "."
	if p := js.Options().APIPrefix; p != "" && p != jetstream.DefaultAPIPrefix {
		pre = p + pre
	}
	return &Snapshots{js: js, pub: js, kv: kv, pre: pre, subj: cfg.Subjects(), slots: make(chan struct{}, putWindow)}, nil
}

// PublishOn makes the puts of [Snapshots.PutNodesAt],
// [Snapshots.PutSummarizedAt] and [Snapshots.PutCheckpointAt] go through
// pub, a JetStream context on a connection of its own with the same
// account (store.Companion), instead of the context the bucket was opened
// with; reads, and the other puts, stay on that one. The reconciler writes
// on such a connection, so that its partitions' reads do not share one
// with its asynchronous puts (docs/architecture.md, "The reconciler
// writes on a connection of its own"). Call it before the first put; nil
// changes nothing.
func (s *Snapshots) PublishOn(pub jetstream.JetStream) {
	if pub != nil {
		s.pub = pub
	}
}

// PublishThrough makes the puts of [Snapshots.PutNodesAt] and
// [Snapshots.PutSummarizedAt] go through p's asynchronous publisher
// instead of the JetStream context's (PublishOn's, or the one the bucket
// was opened with): on p's connection, beside p's appends, under p's
// pending limit ([WithMaxPending]) and ack timeout ([WithAckTimeout]).
// The reconciler's snapshot puts were the last of its publishes through
// the client's PublishMsgAsync (a channel pair, a timer and
// encoding/json of each acknowledgement: 2 % of its CPU folding live on
// the dense mix, issue 27). Give a Publisher on the connection of
// PublishOn's context, if any. Call it before the first put; nil
// changes nothing.
func (s *Snapshots) PublishThrough(p *Publisher) {
	if p != nil {
		s.acks = p.acks
	}
}

// putConn is the connection the puts of PutSummarizedAt go out on.
func (s *Snapshots) putConn() *nats.Conn {
	if s.acks != nil {
		return s.acks.nc
	}
	return s.pub.Conn()
}

// Bucket returns the bucket's name.
func (s *Snapshots) Bucket() string { return s.kv.Bucket() }

func nodeKey(partition int, node string) string {
	return "node." + strconv.Itoa(partition) + "." + node
}

func checkpointKey(partition int) string { return "checkpoint." + strconv.Itoa(partition) }

func checkNode(node string) error {
	if !events.ValidName(node) {
		return &events.FieldError{Field: "node", Value: node, Err: events.ErrBadName}
	}
	return nil
}

// PutNode stores node's state in partition and waits for the ack.
//
// Errors: a bad node name (matching events.ErrInvalid), a negative
// partition, the put's error.
func (s *Snapshots) PutNode(ctx context.Context, partition int, node string, state []byte) error {
	if err := checkNode(node); err != nil {
		return err
	}
	if partition < 0 {
		return fmt.Errorf("put snapshot of %s: partition %d", node, partition)
	}
	if _, err := s.kv.Put(ctx, nodeKey(partition, node), state); err != nil {
		return fmt.Errorf("put snapshot of %s: %w", node, err)
	}
	return nil
}

// PutNodes stores many node states of one partition with async publishes
// and returns once every one is settled (measured on loopback TCP: ~140k
// puts/s against ~24k/s for PutNode one by one). states maps node name to
// state. At most 1024 puts are in flight per Snapshots, across every
// partition writing through it, below the client's default limit of 4000
// pending async publishes; a publish refused because the connection's
// limit is full anyway (other writers on it) is backpressure: it waits
// for this call's own puts to settle and is sent again.
//
// Errors: a bad node name (matching events.ErrInvalid) before anything
// is written; otherwise the first failure, after waiting for the puts in
// flight: even once ctx is done, up to [SettleWait] more for their
// acknowledgements, so that on return the puts sent have landed or
// failed, unless the server left them unanswered that long. On error
// some states may be stored and others not; write the checkpoint only
// after a nil return.
func (s *Snapshots) PutNodes(ctx context.Context, partition int, states map[string][]byte) error {
	return s.PutNodesAt(ctx, partition, states, nil)
}

// SettleWait bounds how long [Snapshots.PutNodesAt] keeps waiting for the
// acknowledgements of puts it sent after its context is done or a put
// failed: a put answered later may still land, moving its key's revision.
const SettleWait = 10 * time.Second

// PutNodesAt is [Snapshots.PutNodes]; with revs non-nil, each put is conditional
// (Nats-Expected-Last-Subject-Sequence) on the key's revision in revs (0:
// no message on the key yet), and revs is updated with each new
// revision, also for puts acknowledged after a failure. A put whose key
// was written by someone else since fails with an error wrapping
// [ErrConflict].
func (s *Snapshots) PutNodesAt(ctx context.Context, partition int, states map[string][]byte, revs map[string]uint64) error {
	return s.PutSummarizedAt(ctx, partition, states, nil, revs)
}

// SummaryHeader is the header of a node's snapshot message that carries
// the node's fleet summary (reconcile.MarshalSummary: what `meshfold
// fleet` needs of the state, printable ASCII): put in the same message as
// the state, it can never disagree with it, and a reader of every node
// can ask for the headers only ([Snapshots.ScanSummaries]).
const SummaryHeader = "Meshfold-Summary"

// NodeConflictError is what [Snapshots.PutNodesAt] and
// [Snapshots.PutSummarizedAt] return when puts failed their revision
// fence: it matches [ErrConflict] through errors.Is, and Nodes names
// every node whose put failed so (sorted), so that a caller can read
// those keys again ([Snapshots.NodeAtLeader]) rather than every key it
// meant to put.
type NodeConflictError struct {
	Nodes []string
	Err   error // the first failure, matching ErrConflict
}

func (e *NodeConflictError) Error() string { return e.Err.Error() }
func (e *NodeConflictError) Unwrap() error { return e.Err }

// PutSummarizedAt is [Snapshots.PutNodesAt] that puts, with each node's
// state, its summary in [SummaryHeader] when summaries has one for it (a
// node without one has none: a reader reads its state instead).
func (s *Snapshots) PutSummarizedAt(ctx context.Context, partition int, states, summaries map[string][]byte, revs map[string]uint64) error {
	if partition < 0 {
		return fmt.Errorf("put snapshots: partition %d", partition)
	}
	nodes := make([]string, 0, len(states))
	for node := range states {
		if err := checkNode(node); err != nil {
			return err
		}
		nodes = append(nodes, node)
	}
	slices.Sort(nodes) // deterministic order: easier to reason about a partial failure
	var (
		inflight  []jetstream.PubAckFuture
		names     []string
		firstErr  error
		conflicts []string // nodes whose put failed its fence
	)
	fail := func(err error) {
		if firstErr == nil {
			firstErr = err
		}
	}
	// settle waits for the oldest put in flight until done closes, and
	// frees its slot; false when done closed first (the put is still in
	// flight).
	settle := func(done <-chan struct{}) bool {
		f, node := inflight[0], names[0]
		select {
		case ack := <-f.Ok():
			if revs != nil {
				revs[node] = ack.Sequence
			}
		case err := <-f.Err():
			err = ServerError(err)
			if errors.Is(err, ErrConflict) {
				conflicts = append(conflicts, node)
			}
			fail(fmt.Errorf("put snapshot of %s: %w", node, err))
		case <-done:
			return false
		}
		<-s.slots
		inflight, names = inflight[1:], names[1:]
		return true
	}
	for _, node := range nodes {
		if firstErr != nil || ctx.Err() != nil {
			break
		}
		if !s.acquire(ctx, &inflight, settle) {
			break
		}
		var opts []jetstream.PublishOpt
		if revs != nil && s.acks == nil {
			opts = append(opts, jetstream.WithExpectLastSequencePerSubject(revs[node]))
		}
		for {
			// A new message each time: the publish adds its options'
			// headers to it.
			msg := &nats.Msg{Subject: s.pre + nodeKey(partition, node), Data: states[node]}
			if sum := summaries[node]; len(sum) > 0 {
				msg.Header = nats.Header{SummaryHeader: []string{string(sum)}}
			}
			f, err := s.putAsync(msg, revs != nil, revs[node], opts)
			if err == nil {
				inflight, names = append(inflight, f), append(names, node)
				break
			}
			if errors.Is(err, jetstream.ErrTooManyStalledMsgs) && ctx.Err() == nil {
				// The connection's pending limit is full: backpressure,
				// not a failure. Let one of ours settle, then send again.
				if len(inflight) > 0 && !settle(ctx.Done()) {
					<-s.slots
					break
				}
				if firstErr == nil {
					continue
				}
			}
			<-s.slots
			if errors.Is(err, jetstream.ErrTooManyStalledMsgs) && ctx.Err() != nil {
				// Stalled until ctx ended: the server answered none of
				// the pending publishes in time. Say so (Unanswered),
				// not only that the limit was full.
				err = fmt.Errorf("%w: %w", ctx.Err(), err)
			}
			fail(fmt.Errorf("put snapshot of %s: %w", node, err))
			break
		}
	}
	if ctx.Err() != nil {
		fail(fmt.Errorf("put snapshots: %w", ctx.Err()))
	}
	// Every put sent is waited for: a caller that gives up and reads the
	// bucket again must not see a revision one of these puts then
	// overtakes. Past a ctx that timed out, for up to SettleWait while
	// the connection stays up; not past a cancelled ctx (the caller is
	// stopping) nor a lost connection (nothing answers until it is back).
	done := s.settling(ctx)
	defer done.stop()
	for len(inflight) > 0 {
		if !settle(done.c) {
			for range inflight {
				<-s.slots
			}
			why := fmt.Sprintf("after %v", SettleWait)
			if !s.putConn().IsConnected() {
				why = "with the connection down"
			}
			fail(fmt.Errorf("put snapshots: %d puts unanswered %s: %w", len(inflight), why, context.DeadlineExceeded))
			break
		}
	}
	if len(conflicts) > 0 && errors.Is(firstErr, ErrConflict) {
		return &NodeConflictError{Nodes: conflicts, Err: firstErr}
	}
	return firstErr
}

// putAsync sends one put of PutSummarizedAt: through acks when set, its
// fence (expect: on revision rev) set in its header as the client's
// option would; otherwise pub's PublishMsgAsync with opts.
func (s *Snapshots) putAsync(msg *nats.Msg, expect bool, rev uint64, opts []jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if s.acks == nil {
		return s.pub.PublishMsgAsync(msg, opts...)
	}
	if expect {
		if msg.Header == nil {
			msg.Header = make(nats.Header, 1)
		}
		setExpectation(msg.Header, rev)
	}
	f, err := s.acks.send(msg)
	if err != nil {
		return nil, err // not a nil *ackFuture in the interface
	}
	return f, nil
}

// settleWindow is how long PutNodesAt still waits for its puts in flight.
type settleWindow struct {
	c    chan struct{}
	stop func()
}

// settling returns a window that closes when ctx is cancelled, SettleWait
// after a ctx that timed out, or when the connection goes down.
func (s *Snapshots) settling(ctx context.Context) settleWindow {
	c := make(chan struct{})
	nc := s.putConn()
	if errors.Is(ctx.Err(), context.Canceled) || !nc.IsConnected() {
		close(c)
		return settleWindow{c: c, stop: func() {}}
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), SettleWait)
	status := nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CLOSED)
	quit := make(chan struct{})
	go func() {
		defer close(c)
		select {
		case <-dctx.Done():
		case <-status:
		case <-quit:
		}
	}()
	stopCtx := context.AfterFunc(ctx, func() {
		if errors.Is(ctx.Err(), context.Canceled) {
			cancel()
		}
	})
	return settleWindow{c: c, stop: func() {
		stopCtx()
		cancel()
		close(quit)
		nc.RemoveStatusListener(status)
	}}
}

// acquire takes one of the Snapshots' put slots, letting this call's own
// puts in flight settle while none is free; false when ctx is done or a
// settled put failed first.
func (s *Snapshots) acquire(ctx context.Context, inflight *[]jetstream.PubAckFuture, settle func(<-chan struct{}) bool) bool {
	for {
		select {
		case s.slots <- struct{}{}:
			return true
		default:
		}
		if len(*inflight) == 0 {
			select {
			case s.slots <- struct{}{}:
				return true
			case <-ctx.Done():
				return false
			}
		}
		if !settle(ctx.Done()) {
			return false
		}
	}
}

// GetNode returns node's state, found in its partition of the stream's,
// and the KV revision it was stored at.
//
// Errors: [ErrNoSnapshot] when none is stored; a bad node name (matching
// events.ErrInvalid); the get's error.
func (s *Snapshots) GetNode(ctx context.Context, node string) ([]byte, uint64, error) {
	if err := checkNode(node); err != nil {
		return nil, 0, err
	}
	e, err := s.kv.Get(ctx, nodeKey(s.subj.Partition(node), node))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, fmt.Errorf("snapshot of %s: %w", node, ErrNoSnapshot)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("get snapshot of %s: %w", node, err)
	}
	return e.Value(), e.Revision(), nil
}

// NodeAt returns node's state in partition and its key's revision: what
// [Snapshots.PutNodesAt] expects next for the key. A key deleted or
// purged gives a nil state and its marker's revision; a key never
// written, nil and 0.
//
// Errors: a bad node name (matching events.ErrInvalid); the read's error.
func (s *Snapshots) NodeAt(ctx context.Context, partition int, node string) (state []byte, rev uint64, err error) {
	if err := checkNode(node); err != nil {
		return nil, 0, err
	}
	st, err := s.stream(ctx)
	if err != nil {
		return nil, 0, err
	}
	return s.nodeAt(ctx, st, partition, node)
}

// NodeAtLeader is [Snapshots.NodeAt] read from the bucket's leader
// ([LeaderReads]): what a writer reads after one of its puts failed its
// fence, to see the revision that failed it (a replica behind the leader
// may answer an older one). Errors: as NodeAt's.
func (s *Snapshots) NodeAtLeader(ctx context.Context, partition int, node string) (state []byte, rev uint64, err error) {
	if err := checkNode(node); err != nil {
		return nil, 0, err
	}
	return s.nodeAt(ctx, Leader(s.js, "KV_"+s.kv.Bucket()), partition, node)
}

func (s *Snapshots) nodeAt(ctx context.Context, st LastGetter, partition int, node string) (state []byte, rev uint64, err error) {
	m, err := st.GetLastMsgForSubject(ctx, "$KV."+s.kv.Bucket()+"."+nodeKey(partition, node))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("get snapshot of %s: %w", node, err)
	}
	if op := m.Header.Get(kvOperation); op == "DEL" || op == "PURGE" {
		return nil, m.Sequence, nil
	}
	return m.Data, m.Sequence, nil
}

// kvOperation is the header a KV delete or purge marker carries.
const kvOperation = "KV-Operation"

// stream returns the bucket's stream, looked up once.
func (s *Snapshots) stream(ctx context.Context) (jetstream.Stream, error) {
	s.streamMu.Lock()
	defer s.streamMu.Unlock()
	if s.st == nil {
		st, err := s.js.Stream(ctx, "KV_"+s.kv.Bucket())
		if err != nil {
			return nil, fmt.Errorf("snapshot bucket's stream: %w", err)
		}
		s.st = st
	}
	return s.st, nil
}

// Stored returns how many messages the bucket holds: one a key
// written (node states, checkpoints, delete markers).
func (s *Snapshots) Stored(ctx context.Context) (uint64, error) {
	status, err := s.kv.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("snapshot bucket status: %w", err)
	}
	return status.Values(), nil
}

// PutCheckpoint records that every state of partition is folded up to
// stream sequence seq. Call it only after the states' puts are
// acknowledged.
func (s *Snapshots) PutCheckpoint(ctx context.Context, partition int, seq uint64) error {
	if partition < 0 {
		return fmt.Errorf("put checkpoint: partition %d", partition)
	}
	if _, err := s.kv.Put(ctx, checkpointKey(partition), []byte(strconv.FormatUint(seq, 10))); err != nil {
		return fmt.Errorf("put checkpoint of partition %d: %w", partition, err)
	}
	return nil
}

// PutCheckpointAt is [Snapshots.PutCheckpoint] conditional on the key's
// revision rev (Nats-Expected-Last-Subject-Sequence; 0: never written),
// as [Snapshots.PutNodesAt] is for states: a put of a writer that read
// the key before another one wrote it fails. It returns the key's new
// revision.
//
// Errors: one wrapping [ErrConflict] when the key was written since rev;
// the publish's otherwise.
func (s *Snapshots) PutCheckpointAt(ctx context.Context, partition int, seq, rev uint64) (uint64, error) {
	if partition < 0 {
		return 0, fmt.Errorf("put checkpoint: partition %d", partition)
	}
	msg := &nats.Msg{Subject: s.pre + checkpointKey(partition), Data: []byte(strconv.FormatUint(seq, 10))}
	ack, err := s.pub.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(rev))
	if err != nil {
		return 0, fmt.Errorf("put checkpoint of partition %d: %w", partition, ServerError(err))
	}
	return ack.Sequence, nil
}

// CheckpointRev returns partition's checkpoint (0 when none is stored) and
// its key's revision (0 when never written), read from the bucket's
// leader ([LeaderReads]): what [Snapshots.PutCheckpointAt] expects next.
//
// Errors: the read's; a value that is not a sequence.
func (s *Snapshots) CheckpointRev(ctx context.Context, partition int) (seq, rev uint64, err error) {
	m, err := Leader(s.js, "KV_"+s.kv.Bucket()).GetLastMsgForSubject(ctx, "$KV."+s.kv.Bucket()+"."+checkpointKey(partition))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("get checkpoint of partition %d: %w", partition, err)
	}
	if op := m.Header.Get(kvOperation); op == "DEL" || op == "PURGE" {
		return 0, m.Sequence, nil
	}
	if seq, err = strconv.ParseUint(string(m.Data), 10, 64); err != nil {
		return 0, 0, fmt.Errorf("checkpoint of partition %d: %q: %w", partition, m.Data, err)
	}
	return seq, m.Sequence, nil
}

// Checkpoint returns partition's checkpoint, 0 when none is stored.
func (s *Snapshots) Checkpoint(ctx context.Context, partition int) (uint64, error) {
	e, err := s.kv.Get(ctx, checkpointKey(partition))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("get checkpoint of partition %d: %w", partition, err)
	}
	seq, err := strconv.ParseUint(string(e.Value()), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("checkpoint of partition %d: %q: %w", partition, e.Value(), err)
	}
	return seq, nil
}

// LoadPartition returns partition's checkpoint (0 when none) and the
// states of all its nodes (node name → state; empty, not nil, when none).
// The checkpoint is read first, so every state returned is at or past it.
// The states come from one KV watch over node.<partition>.* that ends at
// the end-of-initial-values marker: one ordered pass over the latest
// values, not a get per node (10,000 states of 600 B load in ~25 ms here,
// see docs/store.md).
func (s *Snapshots) LoadPartition(ctx context.Context, partition int) (checkpoint uint64, nodes map[string][]byte, err error) {
	nodes = make(map[string][]byte)
	checkpoint, _, err = s.ScanPartition(ctx, partition, func(node string, state []byte) error {
		nodes[node] = state
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	return checkpoint, nodes, nil
}

// ScanPartition is [Snapshots.LoadPartition] that hands each node's state
// to fn as the pass reads it instead of returning them all, and returns
// the revision of every node key of the partition, deleted or purged ones
// included (their marker's revision): what [Snapshots.PutNodesAt] expects
// next. A caller that decodes each state as it comes holds one raw state
// at a time, not its partition's (a reconciler loading its 16 partitions
// at once held every raw snapshot of the fleet besides the decoded
// states: 7.1 KiB of RSS a node for 2.4 KiB of heap, issue 17). A key written again during the
// pass may come twice; the later is the newer. fn's error stops the pass
// and is returned as is.
func (s *Snapshots) ScanPartition(ctx context.Context, partition int, fn func(node string, state []byte) error) (checkpoint uint64, revs map[string]uint64, err error) {
	if partition < 0 {
		return 0, nil, fmt.Errorf("load partition %d", partition)
	}
	if checkpoint, err = s.Checkpoint(ctx, partition); err != nil {
		return 0, nil, err
	}
	if revs, err = s.ScanPartitionStates(ctx, partition, fn); err != nil {
		return 0, nil, err
	}
	return checkpoint, revs, nil
}

// ScanPartitionStates is [Snapshots.ScanPartition] without its read of
// the checkpoint, for a caller that read it already (the reconciler's
// session, with its revision: [Snapshots.CheckpointRev]), before the
// pass: every state the pass reads is then at or past that checkpoint,
// as for ScanPartition. A second read of the key was a round trip of
// every session's start (issue 27, a cold refold's fixed costs).
func (s *Snapshots) ScanPartitionStates(ctx context.Context, partition int, fn func(node string, state []byte) error) (revs map[string]uint64, err error) {
	if partition < 0 {
		return nil, fmt.Errorf("load partition %d", partition)
	}
	revs = make(map[string]uint64)
	var fnErr error
	err = s.scanEntries(ctx, "node."+strconv.Itoa(partition)+".*", true, func(node string, e jetstream.KeyValueEntry) error {
		revs[node] = e.Revision()
		if e.Operation() == jetstream.KeyValuePut {
			if fnErr = fn(node, e.Value()); fnErr != nil {
				return fnErr
			}
		}
		return nil
	})
	if fnErr != nil {
		return nil, fnErr
	}
	if err != nil {
		return nil, fmt.Errorf("load partition %d: %w", partition, err)
	}
	return revs, nil
}

// LoadAll calls fn with every node's state, all partitions, in one
// ordered pass over the bucket's latest values. fn's error stops the pass
// and is returned as is.
func (s *Snapshots) LoadAll(ctx context.Context, fn func(node string, state []byte) error) error {
	return s.scan(ctx, "node.>", fn)
}

// ScanSummaries calls fn with every node's summary ([SummaryHeader]), all
// partitions, in one pass over the latest node values that asks the
// server for their headers only: the states are not sent (at 100,000
// nodes of 2.9 kB, 280 MB not read). fn's summary must not be written to;
// it may be kept. A node whose latest state carries no summary (written by a build
// that wrote none, or with no room for one) is not passed to fn but
// returned in bare, in bucket order: read its state (GetNode, or LoadAll
// when many). Deleted and purged keys are skipped. fn's error stops the
// pass and is returned as is.
//
// The pass is an ephemeral pull consumer whose messages come to a plain
// subscription, pulled [summaryBatch] at a time, not the client's ordered
// pull consumer, which reset a timer and parsed every message's metadata
// into a struct (issue 27: the client's reading was a third of fleet -o
// json's CPU). It asks for what the ordered consumer asked (consumer
// create, next, delete): a user's permissions are unchanged. Each
// message's consumer sequence is read from its reply subject: a gap (a
// message lost to a reconnect) or the consumer gone ends the pass with
// [ErrSummaryGap] before fn sees a node twice or one is missed; the
// caller reads again. fn is called on the subscription's goroutine, one
// node at a time.
func (s *Snapshots) ScanSummaries(ctx context.Context, fn func(node string, summary []byte) error) (bare []string, err error) {
	bucket := s.kv.Bucket()
	stream := "KV_" + bucket
	keyPre := "$KV." + bucket + "."
	nc := s.js.Conn()
	inbox := nc.NewInbox()
	var (
		ready = make(chan struct{}) // closed once left is set
		done  = make(chan error, 1)
		left  uint64 // the initial values still to come
		last  uint64 // the last consumer sequence seen
		seen  atomic.Uint64
		next  string // the consumer's next-messages subject
		// pullMore asks for half a batch more.
		pullMore = fmt.Appendf(nil, `{"batch":%d,"expires":%d,"idle_heartbeat":%d}`, summaryBatch/2, summaryExpires, summaryHeartbeat)
		mu       sync.Mutex // held by the callback a message at a time
		fail     error      // set once, under mu: no message is read after
	)
	finish := func(err error) {
		fail = err
		if err == nil {
			fail = errSummaryDone
		}
		done <- err
	}
	sub, err := nc.Subscribe(inbox, func(m *nats.Msg) {
		<-ready
		mu.Lock()
		defer mu.Unlock()
		if fail != nil {
			return
		}
		seen.Add(1)
		if len(m.Data) == 0 {
			switch st := m.Header.Get("Status"); st {
			case "":
			case "100", "408": // a heartbeat; a pull that expired waiting
				return
			default: // the consumer gone, or another end
				finish(fmt.Errorf("read summaries of %s: status %s %s: %w", bucket, st, m.Header.Get("Description"), ErrSummaryGap))
				return
			}
		}
		cseq, pending, ok := ackSeqs(m.Reply)
		if !ok {
			finish(fmt.Errorf("read summaries of %s: reply subject %q", bucket, m.Reply))
			return
		}
		if cseq != last+1 {
			finish(fmt.Errorf("read summaries of %s: consumer sequence %d after %d: %w", bucket, cseq, last, ErrSummaryGap))
			return
		}
		last = cseq
		if cseq%(summaryBatch/2) == 0 { // half the pull in: ask for as much again
			if err := nc.PublishRequest(next, inbox, pullMore); err != nil {
				finish(fmt.Errorf("read summaries of %s: %w", bucket, err))
				return
			}
		}
		// Pending counts what was stored after the consumer began too;
		// those come after the initial values, which end at 0.
		left = min(left-1, pending)
		if node, ok := nodeOfKeyFast(strings.TrimPrefix(m.Subject, keyPre)); ok {
			h := m.Header
			if op := h.Get("KV-Operation"); op == "DEL" || op == "PURGE" || h.Get(jetstream.MarkerReasonHeader) != "" {
				// deleted or purged
			} else if sum := h.Get(SummaryHeader); sum == "" {
				bare = append(bare, node)
			} else if err := fn(node, unsafe.Slice(unsafe.StringData(sum), len(sum))); err != nil {
				fail = err
				done <- err
				return
			}
		}
		if left == 0 {
			finish(nil)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("read summaries of %s: %w", bucket, err)
	}
	defer sub.Unsubscribe()
	// stop ends the pass early: once it returns, fn is not running and
	// is not called again.
	stop := func() {
		_ = sub.Unsubscribe()
		mu.Lock()
		if fail == nil {
			fail = errSummaryDone
		}
		mu.Unlock()
	}
	// At most summaryBatch are in flight: hold them all rather than drop
	// any.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, fmt.Errorf("read summaries of %s: %w", bucket, err)
	}
	// The creation is asked of the meta leader: one sent while the
	// cluster elects one (a kill -9 of it) is never answered, and asked
	// once it failed at the client's 5 s API timeout, a bare "context
	// deadline exceeded" seconds after the kill (a fresh user's finding
	// M3). Asked again as every consumer's creation is (AskAgain), it
	// waits up to the verb's --timeout and then says the stream did not
	// answer.
	cons, err := AskAgain(ctx, s.js, stream, func(ctx context.Context) (jetstream.Consumer, error) {
		return s.js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
			FilterSubjects:    []string{keyPre + "node.>"},
			DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
			AckPolicy:         jetstream.AckNonePolicy,
			HeadersOnly:       true,
			InactiveThreshold: OrderedInactive,
			MemoryStorage:     true,
			Replicas:          1,
		})
	})
	if err != nil {
		stop()
		close(ready)
		return nil, fmt.Errorf("read summaries of %s: %w", bucket, err)
	}
	name := cons.CachedInfo().Name
	next = "$JS.API.CONSUMER.MSG.NEXT." + stream + "." + name
	// Deleted at the end without awaiting the answer (its inactivity
	// threshold ends one whose request is lost): awaited, a loaded API
	// held every `fleet` up to 5 s after its last summary.
	defer dropConsumer(s.js, stream, name)
	left = cons.CachedInfo().NumPending
	if left == 0 {
		fail = errSummaryDone
		close(ready)
		return nil, nil
	}
	close(ready)
	first := fmt.Appendf(nil, `{"batch":%d,"expires":%d,"idle_heartbeat":%d}`, summaryBatch, summaryExpires, summaryHeartbeat)
	if err := nc.PublishRequest(next, inbox, first); err != nil {
		stop()
		return nil, fmt.Errorf("read summaries of %s: %w", bucket, err)
	}
	// No message (not even a heartbeat) for three heartbeats: the
	// consumer or the connection is gone.
	tick := time.NewTicker(3 * summaryHeartbeat)
	defer tick.Stop()
	var was uint64
	for {
		select {
		case err := <-done:
			if err != nil {
				return nil, err
			}
			return bare, nil
		case <-ctx.Done():
			stop()
			return nil, fmt.Errorf("read summaries of %s: %w", bucket, ctx.Err())
		case <-tick.C:
			if n := seen.Load(); n != was {
				was = n
				continue
			}
			stop()
			return nil, fmt.Errorf("read summaries of %s: nothing for %s: %w", bucket, 3*summaryHeartbeat, ErrSummaryGap)
		}
	}
}

// ErrSummaryGap: [Snapshots.ScanSummaries] lost a message of its pass (a
// reconnect, or its consumer gone); read again.
var ErrSummaryGap = errors.New("store: summaries' pass lost a message")

// errSummaryDone marks a pass that has ended well: later messages are
// dropped.
var errSummaryDone = errors.New("done")

// summaryBatch is how many headers [Snapshots.ScanSummaries] has in
// flight at most: it asks for this many, then for half as many each time
// half a batch has come.
const summaryBatch = 4096

// summaryHeartbeat is the idle heartbeat of [Snapshots.ScanSummaries]'
// pulls (nothing for three ends the pass), summaryExpires how long each
// waits for messages stored after the pass began.
const (
	summaryHeartbeat = 5 * time.Second
	summaryExpires   = time.Minute
)

// ackSeqs reads the consumer sequence and the pending count from a
// JetStream message's reply subject, without allocating:
// $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>,
// or with <domain>.<account hash> before <stream> (and a token after).
func ackSeqs(reply string) (cseq, pending uint64, ok bool) {
	rest, ok := strings.CutPrefix(reply, "$JS.ACK.")
	if !ok {
		return 0, 0, false
	}
	var tok [12]string
	n := 0
	for n < len(tok) {
		i := strings.IndexByte(rest, '.')
		if i < 0 {
			tok[n] = rest
			n++
			break
		}
		tok[n], rest = rest[:i], rest[i+1:]
		n++
	}
	var c, p string
	switch {
	case n == 7: // stream consumer delivered sseq cseq ts pending
		c, p = tok[4], tok[6]
	case n >= 9: // domain hash stream consumer delivered sseq cseq ts pending …
		c, p = tok[6], tok[8]
	default:
		return 0, 0, false
	}
	cseq, err1 := strconv.ParseUint(c, 10, 64)
	pending, err2 := strconv.ParseUint(p, 10, 64)
	return cseq, pending, err1 == nil && err2 == nil
}

// nodeOfKeyFast is nodeOfKey without allocating.
func nodeOfKeyFast(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, "node.")
	if !ok {
		return "", false
	}
	_, node, ok := strings.Cut(rest, ".")
	return node, ok
}

// ListNodes returns the names of every node with a stored state, sorted.
// It reads keys only, not states.
func (s *Snapshots) ListNodes(ctx context.Context) ([]string, error) {
	kl, err := s.kv.ListKeysFiltered(ctx, "node.>")
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil, nil
		}
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	defer kl.Stop()
	var out []string
	for key := range kl.Keys() {
		if node, ok := nodeOfKey(key); ok {
			out = append(out, node)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// nodeOfKey parses node.<p>.<node>.
func nodeOfKey(key string) (string, bool) {
	parts := strings.SplitN(key, ".", 3)
	if len(parts) != 3 || parts[0] != "node" {
		return "", false
	}
	return parts[2], true
}

// scan calls fn for the latest value of every key matching filter, in
// one watch that stops at the end-of-initial-values marker.
func (s *Snapshots) scan(ctx context.Context, filter string, fn func(node string, state []byte) error) error {
	return s.scanEntries(ctx, filter, false, func(node string, e jetstream.KeyValueEntry) error {
		return fn(node, e.Value())
	})
}

// scanEntries is scan over whole entries; with deletes, deleted and
// purged keys come too (their markers' entries).
func (s *Snapshots) scanEntries(ctx context.Context, filter string, deletes bool, fn func(node string, e jetstream.KeyValueEntry) error) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var opts []jetstream.WatchOpt
	if !deletes {
		opts = append(opts, jetstream.IgnoreDeletes())
	}
	w, err := s.kv.Watch(wctx, filter, opts...)
	if err != nil {
		return fmt.Errorf("watch %s: %w", filter, err)
	}
	defer func() {
		// Stopping deletes the watch's consumer, a request to the server
		// the scan's caller need not wait for: each partition's session
		// start waited for it (~16 ms of a 1,000-node cold refold's start-up
		// under load, issue 27). Then unblock the watcher's delivery if it
		// is waiting to hand over a value nobody will read; the channel
		// closes once it is stopped.
		go func() {
			_ = w.Stop()
			for range w.Updates() {
			}
		}()
	}()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("watch %s: closed before its initial values were done", filter)
			}
			if e == nil {
				return nil
			}
			node, ok := nodeOfKey(e.Key())
			if !ok {
				continue
			}
			if err := fn(node, e); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
