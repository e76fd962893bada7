package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
)

// TailConfig configures [Follow].
type TailConfig struct {
	// Stream is the stream's name.
	Stream string
	// Subjects decodes the subjects [Tail.Next] returns (its prefix and
	// partition count: the stream's, StreamConfig.Subjects); the zero
	// value is the default prefix and count.
	Subjects events.Subjects
	// Filter is the one stored subject (or wildcard) read, e.g.
	// Subjects.Stored(node, kind); "" reads the whole stream. One filter:
	// the server serves it from its subject index, while several filters
	// make it scan.
	Filter string
	// Where the tail starts, the first that is set: New (only messages
	// stored from now on), StartTime (the first message stored at or
	// after it), Start (the first stream sequence delivered; 0 and 1 both
	// mean the stream's first message).
	New       bool
	StartTime time.Time
	Start     uint64
	// Heartbeat is the consumer's idle heartbeat; 0: the client's default.
	// The client recreates the consumer after two missed heartbeats, so a
	// short one resumes a read sooner after the server holding the
	// consumer stops.
	Heartbeat time.Duration
	// ResetAttempts bounds how many times the client tries to recreate a
	// consumer it lost (its server stopped) before the tail ends with an
	// error; 0: forever, the client's default, with waits growing to
	// 10 s between attempts of up to 10 s each. A reader that restarts
	// its tail itself, on its own schedule, sets a small bound.
	ResetAttempts int
	// EndOnLoss ends the tail, with an error matching
	// [ErrConsumerLost], the first time its consumer is lost, instead of
	// letting the client recreate it: when two idle heartbeats are
	// missed and the consumer then does not answer for its info within
	// lossAsk (the server holding it stopped), the consumer is deleted,
	// or a delivery is skipped. Missed heartbeats of a consumer that
	// answers are read on through: the client has pulled again on its
	// own, and a loaded machine (a client or a server starved for two
	// heartbeats) is no loss. The client's recreation sends
	// its request, up to 10 s long, to whichever meta leader it finds,
	// and after a crash of the server that led the cluster's metadata it
	// went unanswered for the whole 10 s while a new one was elected in
	// 5–8 s. For a reader that follows again itself from its last
	// message, with attempts of its own (the reconciler's partitions).
	// When the tail's connection reconnects, the consumer is asked for
	// at once, and one the server does not hold (it restarted) ends the
	// tail too, without waiting for the heartbeats (watchReconnects).
	// The consumer is a plain ephemeral one (no acknowledgements, one
	// replica, in memory), checked for skipped deliveries as the
	// client's ordered consumer is; ResetAttempts is not used.
	EndOnLoss bool

	// lossAsk: the tests' bound of the ask after missed heartbeats (0:
	// lossAsk, the package's).
	lossAsk time.Duration
}

// ErrConsumerLost: the consumer of a [Tail] started with
// TailConfig.EndOnLoss was lost (its server stopped, it was deleted, or
// a delivery was skipped); the tail is over. Follow again from the
// message after the last one read.
var ErrConsumerLost = errors.New("store: the tail's consumer was lost")

// Tailed is one message of a [Tail] as read, with its metadata, or the
// error that ended the tail: what [Tail.C] carries for a reader that
// decodes only some messages (the reconciler's partitions). [Tail.Next]
// returns it decoded.
type Tailed struct {
	Msg  jetstream.Msg
	Meta *jetstream.MsgMetadata
	Err  error
}

// Tail is a follow of one subject filter in stream order from a start
// sequence, with an ordered consumer: every message once, in order, and
// messages published later as they arrive. It is the one reader every
// role uses (the reconciler's partitions, a node's plans, a provisioner's
// knocks and settles, [ReadNode], [JournalWarnings], the console's live
// view, the demo). Stop it when done: that deletes the
// consumer.
type Tail struct {
	js     jetstream.JetStream
	stream string
	subj   events.Subjects
	cons   jetstream.Consumer
	it     jetstream.MessagesContext // nil with endOnLoss
	// cc is an endOnLoss tail's callback consumption (nil otherwise);
	// sendMu guards its sends and ended, set once an error was sent or
	// the tail stopped.
	cc     jetstream.ConsumeContext
	sendMu sync.Mutex
	ended  bool
	ch     chan Tailed
	done   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
	// endOnLoss: see TailConfig.EndOnLoss; delivered is the consumer
	// sequence of the last message read (the next must be delivered+1).
	endOnLoss bool
	delivered uint64
	// asking is set while an endOnLoss tail asks its consumer whether it
	// lives after missed heartbeats (heartbeatsMissed); ctx, cancelled by
	// Stop, bounds that ask.
	asking atomic.Bool
	missed atomic.Int32
	// reasked counts the reconnects whose asks are done (the tests).
	reasked atomic.Int32
	lossAsk time.Duration
	ctx     context.Context
	cancel  context.CancelFunc
	// nc and status: an endOnLoss tail's connection and its listener of
	// the connection's reconnects (watchReconnects); nil when js has no
	// connection.
	nc     *nats.Conn
	status chan nats.Status
	// empty: nothing matched the filter when the consumer was created
	// (Empty); kept, as the consumer's cached info changes with each
	// later ask of its info.
	empty bool
}

// Follow starts a [Tail]. Its messages arrive on [Tail.C] (or through
// [Tail.Next]); the consumer is created before Follow returns.
//
// Errors: the consumer's creation (a missing stream matches
// jetstream.ErrStreamNotFound).
func Follow(ctx context.Context, js jetstream.JetStream, cfg TailConfig) (*Tail, error) {
	occ := jetstream.OrderedConsumerConfig{
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: OrderedInactive,
		MaxResetAttempts:  cfg.ResetAttempts,
	}
	if cfg.Filter != "" {
		occ.FilterSubjects = []string{cfg.Filter}
	}
	switch {
	case cfg.New:
		occ.DeliverPolicy = jetstream.DeliverNewPolicy
	case !cfg.StartTime.IsZero():
		occ.DeliverPolicy, occ.OptStartTime = jetstream.DeliverByStartTimePolicy, &cfg.StartTime
	case cfg.Start > 1:
		occ.DeliverPolicy, occ.OptStartSeq = jetstream.DeliverByStartSequencePolicy, cfg.Start
	}
	var (
		cons jetstream.Consumer
		err  error
		what = "ordered consumer"
	)
	if cfg.EndOnLoss {
		what = "consumer"
		cons, err = js.CreateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{
			DeliverPolicy: occ.DeliverPolicy, OptStartSeq: occ.OptStartSeq, OptStartTime: occ.OptStartTime,
			FilterSubject: cfg.Filter, AckPolicy: jetstream.AckNonePolicy,
			InactiveThreshold: OrderedInactive, Replicas: 1, MemoryStorage: true})
	} else {
		cons, err = js.OrderedConsumer(ctx, cfg.Stream, occ)
	}
	if err != nil {
		return nil, fmt.Errorf("%s on %s: %w", what, cfg.Stream, err)
	}
	t := &Tail{js: js, stream: cfg.Stream, subj: cfg.Subjects, cons: cons, ch: make(chan Tailed, tailBuffer), done: make(chan struct{}),
		endOnLoss: cfg.EndOnLoss, lossAsk: cmp.Or(cfg.lossAsk, lossAsk)}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	if info := cons.CachedInfo(); info != nil && info.NumPending == 0 {
		t.empty = true
	}
	if cfg.EndOnLoss {
		// A callback per message, not an iterator: the iterator's Next
		// arms and stops a heartbeat timer of its own at every call
		// (~125 B and 2.7 allocations a message, 4-5 % of a catch-up's
		// CPU), where the callback's subscription keeps one and resets
		// it (docs/architecture.md, "Catch-up speed").
		copts := []jetstream.PullConsumeOpt{jetstream.ConsumeErrHandler(t.consumeErr)}
		if cfg.Heartbeat > 0 {
			copts = append(copts, jetstream.PullHeartbeat(cfg.Heartbeat))
		}
		if t.cc, err = cons.Consume(t.deliver, copts...); err != nil {
			t.cancel()
			DropOrdered(js, cfg.Stream, cons)
			return nil, fmt.Errorf("%s on %s: %w", what, cfg.Stream, err)
		}
		// The client also ends a consumption on its own, on a status
		// it cannot read (a malformed pending count), telling the error
		// callback an error consumeErr does not know; the iterator's
		// Next returned it. Without this watch the tail would then wait,
		// silent, until its reader's context ended.
		closed := t.cc.Closed()
		if nc := js.Conn(); nc != nil {
			// Registered before Follow returns: a reconnect from now on
			// is seen (nats.go sends each status to every listener).
			t.nc, t.status = nc, nc.StatusChanged(nats.CONNECTED)
			go t.watchReconnects()
		}
		go func() {
			select {
			case <-closed:
				select {
				case <-t.done: // Stop's own
				default:
					t.send(Tailed{Err: fmt.Errorf("%w: the client ended the consumption", ErrConsumerLost)})
				}
			case <-t.done:
			}
		}()
		return t, nil
	}
	var opts []jetstream.PullMessagesOpt
	if cfg.Heartbeat > 0 {
		opts = append(opts, jetstream.PullHeartbeat(cfg.Heartbeat))
	}
	if t.it, err = cons.Messages(opts...); err != nil {
		t.cancel()
		DropOrdered(js, cfg.Stream, cons)
		return nil, fmt.Errorf("%s on %s: %w", what, cfg.Stream, err)
	}
	t.wg.Add(1)
	go t.pump()
	return t, nil
}

// deliver is an EndOnLoss tail's message callback: the message with its
// metadata, checked for a skipped delivery, handed on (or the error).
func (t *Tail) deliver(m jetstream.Msg) {
	x := Tailed{Msg: m}
	if x.Meta, x.Err = m.Metadata(); x.Err != nil {
		x.Msg = nil
	}
	t.send(x)
}

// consumeErr is an EndOnLoss tail's error callback. It ends the tail on
// the errors the iterator's Next returned (with missing heartbeats
// reported): a terminal status of the server (the consumer deleted, a
// bad request) and the connection closed, and two missed heartbeats
// once the consumer does not answer for its info (heartbeatsMissed);
// the client's other notices (a leadership change, a pull it sends
// again) the iterator did not return either.
func (t *Tail) consumeErr(_ jetstream.ConsumeContext, err error) {
	switch {
	case errors.Is(err, jetstream.ErrNoHeartbeat):
		t.heartbeatsMissed(err)
	case errors.Is(err, jetstream.ErrConsumerDeleted),
		errors.Is(err, jetstream.ErrBadRequest), errors.Is(err, jetstream.ErrConnectionClosed):
		t.send(Tailed{Err: err})
	}
}

// lossAsk bounds the ask of a consumer's info after two of its
// heartbeats were missed (heartbeatsMissed); it is the reconciler's
// bound for the same ask after an election (engine readStallAsk).
const lossAsk = 2 * time.Second

// heartbeatsMissed handles err, the client's report that two heartbeats
// of an EndOnLoss tail's consumer were missed: it asks the consumer for
// its info, within lossAsk, on a goroutine of its own (not the client's,
// whose consumption it would hold), and ends the tail with err and the
// ask's error unless the consumer answers. One that answers lives on its
// server, and the client has already pulled again on its own (a plain
// consumer's consumption reads on after missed heartbeats); the tail
// reads on. Missed heartbeats alone were taken for a loss, and a loaded
// machine (a client or a server starved for two heartbeats) ended reads
// whose consumers lived: a partition, a node's feed, moved to a new
// consumer, asked of the meta leader, logged at warn level
// (docs/architecture.md, "Missed heartbeats are asked about"). Reports
// while an ask is out are dropped: the ask answers them too.
func (t *Tail) heartbeatsMissed(err error) {
	t.missed.Add(1)
	if !t.asking.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer t.asking.Store(false)
		ctx, cancel := context.WithTimeout(t.ctx, t.lossAsk)
		_, ierr := t.cons.Info(ctx)
		cancel()
		if ierr != nil {
			t.send(Tailed{Err: fmt.Errorf("%w (the consumer's info: %w)", err, ierr)})
		}
	}()
}

// reconnectAsks bounds how many times an EndOnLoss tail asks its
// consumer's info after its connection reconnected while the answers
// say only that JetStream does not answer yet (no responders, a 503);
// reconnectAskAgain is the wait between those asks. Variables for the
// tests.
var (
	reconnectAsks     = 5
	reconnectAskAgain = 250 * time.Millisecond
)

// watchReconnects runs for an EndOnLoss tail while it lasts: each time
// its connection reconnects, it asks the consumer for its info at once
// (reconnected). A consumer lost with its server (a restarted server
// holds no ephemeral consumer of before: an embedded `serve`'s, a
// standalone nats-server's) was otherwise seen only after two missed
// heartbeats, which the client counts from the reconnect: every feed of
// every agent read nothing for 10–12 s after its connection came back
// (a fresh user's finding M4, docs/architecture.md "A feed asks for its
// consumer when its connection comes back").
func (t *Tail) watchReconnects() {
	for {
		select {
		case _, ok := <-t.status:
			if !ok {
				return
			}
			t.reconnected()
			t.reasked.Add(1)
		case <-t.done:
			return
		}
	}
}

// reconnected asks the consumer of an EndOnLoss tail whose connection
// has just reconnected for its info, each ask within lossAsk, and ends
// the tail (an error matching ErrConsumerLost and
// jetstream.ErrConsumerNotFound) when the server says it does not hold
// it. A consumer that answers lives (the connection alone was lost) and
// the tail reads on. An ask unanswered (a denied CONSUMER.INFO, a
// cluster electing its meta leader) leaves the loss to the missed
// heartbeats, as before; an answer that JetStream is not up yet is
// asked again, up to reconnectAsks times. The re-creation that follows
// a loss is its reader's, paced with jitter ([FeedBackoff]), so a fleet
// that reconnects at once does not re-create at once.
func (t *Tail) reconnected() {
	for i := 0; i < reconnectAsks; i++ {
		ctx, cancel := context.WithTimeout(t.ctx, t.lossAsk)
		_, err := t.cons.Info(ctx)
		cancel()
		switch {
		case err == nil, t.ctx.Err() != nil, errors.Is(err, context.DeadlineExceeded):
			return
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			t.send(Tailed{Err: fmt.Errorf("gone when the connection came back: %w", err)})
			return
		}
		select {
		case <-time.After(reconnectAskAgain):
		case <-t.done:
			return
		}
	}
}

// send hands x on to the reader of an EndOnLoss tail, once lost has
// checked it, unless the tail already ended (an error was sent, or
// Stop): after an error nothing more arrives. Callbacks of
// the message and of the errors run on different goroutines of the
// client; sendMu keeps their sends in one order.
func (t *Tail) send(x Tailed) {
	t.sendMu.Lock()
	defer t.sendMu.Unlock()
	if t.ended {
		return
	}
	x.Err = t.lost(x)
	if x.Err != nil {
		x.Msg, x.Meta = nil, nil
		x.Err = fmt.Errorf("read %s: %w", t.stream, x.Err)
		t.ended = true
	}
	select {
	case t.ch <- x:
	case <-t.done:
		t.ended = true
	}
}

// tailBuffer is how many messages a tail's pump may read ahead of its
// reader. Unbuffered, every message cost a goroutine handoff both ways,
// ~10 % of a reconciler's catch-up (issue 17); the client buffers a pull's
// messages anyway, so reading ahead holds nothing the client did not.
const tailBuffer = 64

// pump hands each message on, until an error (sent too) or Stop.
func (t *Tail) pump() {
	defer t.wg.Done()
	for {
		var x Tailed
		x.Msg, x.Err = t.it.Next()
		if x.Err == nil {
			if x.Meta, x.Err = x.Msg.Metadata(); x.Err != nil {
				x.Msg = nil
			}
		}
		if x.Err != nil {
			x.Msg, x.Meta = nil, nil
			x.Err = fmt.Errorf("read %s: %w", t.stream, x.Err)
		}
		select {
		case t.ch <- x:
		case <-t.done:
			return
		}
		if x.Err != nil {
			return
		}
	}
}

// lost checks x, read by a tail with endOnLoss: a delivery skipped, or
// an error of a lost consumer, gives an error matching ErrConsumerLost;
// other errors are returned as they are.
func (t *Tail) lost(x Tailed) error {
	switch err := x.Err; {
	case err == nil:
		if seq := x.Meta.Sequence.Consumer; seq != t.delivered+1 {
			return fmt.Errorf("%w: delivery %d after %d", ErrConsumerLost, seq, t.delivered)
		}
		t.delivered++
		return nil
	case errors.Is(err, jetstream.ErrNoHeartbeat), errors.Is(err, jetstream.ErrConsumerDeleted),
		errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("%w: %w", ErrConsumerLost, err)
	default:
		return err
	}
}

// C returns the channel of the tail's messages as read, for a select
// (decode each with [Tail.Decode]). After an element with Err set
// nothing more arrives.
func (t *Tail) C() <-chan Tailed { return t.ch }

// Next returns the next message, decoded ([Tail.Decode]).
//
// Errors: ctx's error; the read's error (the tail is then over).
func (t *Tail) Next(ctx context.Context) (Msg, error) {
	select {
	case x := <-t.ch:
		if x.Err != nil {
			return Msg{}, x.Err
		}
		return t.Decode(x), nil
	case <-ctx.Done():
		return Msg{}, ctx.Err()
	}
}

// boundRecheck is how long [Tail.NextUpTo] waits for a message before it
// asks the stream's leader again whether the read's end is still held.
// A variable for the tests.
var boundRecheck = 500 * time.Millisecond

// NextUpTo returns the next message of a read bounded by end, the
// sequence of its last message as leader had it ([ReadNode],
// [JournalWarningSeqs], a partition's tail past its checkpoint). It
// waits as [Tail.C] does; while nothing arrives, it asks leader every
// boundRecheck whether end is still held ([LeaderReads.Removed]), and
// once it is not (a limit removed it meanwhile, before the consumer
// delivered it), returns gone true: the read ends short of end, as it
// does when its consumer reports nothing pending past a removed end.
// Without the asking, a read whose end a limit removed after its last
// message with nothing pending (or while messages were still pending
// before it) waited until its context ended or another message of its
// filter came (reviewer's finding). A leader that does not answer
// within 2 boundRecheck counts as holding end: the read waits on.
//
// Errors: ctx's error; the read's error (the tail is then over).
func (t *Tail) NextUpTo(ctx context.Context, leader *LeaderReads, end uint64) (x Tailed, gone bool, err error) {
	select {
	case x = <-t.ch:
		return x, false, x.Err
	default:
	}
	timer := time.NewTimer(boundRecheck)
	defer timer.Stop()
	for {
		select {
		case x = <-t.ch:
			return x, false, x.Err
		case <-timer.C:
			// Each ask bounded, so that a slow answer does not hold
			// back a message arriving meanwhile.
			rctx, cancel := context.WithTimeout(ctx, 2*boundRecheck)
			gone := leader.Removed(rctx, end)
			cancel()
			if gone {
				return Tailed{}, true, nil
			}
			timer.Reset(boundRecheck)
		case <-ctx.Done():
			return Tailed{}, false, ctx.Err()
		}
	}
}

// Decode returns x, a message of the tail (x.Err nil), decoded: its
// event (with its stream sequence and time), subject, message id,
// claimed signer, headers, payload and pending count. A subject that
// names no node and kind gives an event with Kind empty and Err saying
// why (matching events.ErrBadSubject or events.ErrUnknownKind); a payload
// that cannot be decoded or validated, one with Err set and Payload nil
// (DESIGN.md §3: the fold journals it).
func (t *Tail) Decode(x Tailed) Msg {
	seq := x.Meta.Sequence.Stream
	ev, err := t.subj.DecodeEvent(x.Msg.Subject(), x.Msg.Data(), seq, x.Meta.Timestamp)
	if err != nil {
		ev = events.Event{Seq: seq, Time: x.Meta.Timestamp, Err: err}
	}
	return newMsg(ev, x.Msg.Subject(), x.Msg.Headers(), x.Msg.Data(), x.Meta.NumPending)
}

// Pending returns how many messages of the tail's filter its consumer
// has not delivered yet, as the server holding the consumer counts them
// (its info): what a reader that received nothing for a while asks to
// tell an idle read (0) from a stalled one (a consumer holding input
// while its deliveries, and any error of theirs, have stopped coming).
//
// Errors: the info request's (jetstream.ErrConsumerNotFound when the
// consumer is gone; a timeout when its server does not answer).
func (t *Tail) Pending(ctx context.Context) (uint64, error) {
	info, err := t.cons.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.NumPending, nil
}

// Empty reports whether nothing matched the filter from the start when
// the consumer was created.
func (t *Tail) Empty() bool { return t.empty }

// Stop ends the tail and deletes its consumer. It is idempotent.
func (t *Tail) Stop() {
	t.once.Do(func() {
		close(t.done)
		t.cancel()
		if t.cc != nil {
			if t.status != nil {
				t.nc.RemoveStatusListener(t.status)
			}
			t.cc.Stop()
			t.sendMu.Lock()
			t.ended = true
			t.sendMu.Unlock()
		} else {
			t.it.Stop()
			t.wg.Wait()
		}
		DropOrdered(t.js, t.stream, t.cons)
	})
}
