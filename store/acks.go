package store

import (
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultAckTimeout bounds the wait for an asynchronous publish's answer
// when [WithAckTimeout] does not: past it the publish's future fails
// with jetstream.ErrAsyncPublishTimeout ([Unanswered], [Resendable]).
const DefaultAckTimeout = 10 * time.Second

// DefaultMaxPending is how many asynchronous publishes of a Publisher
// wait for their answers at once when [WithMaxPending] does not say:
// the client's own default (nats.go's 4,000).
const DefaultMaxPending = 4000

// stallWait is how long a send past the pending limit waits for room
// before it fails with jetstream.ErrTooManyStalledMsgs: the client's own
// (nats.go's 200 ms).
const stallWait = 200 * time.Millisecond

// noResponderRetries and noResponderWait are the client's own pacing of
// a publish no stream listened to (nats.go's DefaultPubRetryAttempts and
// DefaultPubRetryWait): sent again twice, 250 ms apart, then failed with
// jetstream.ErrNoStreamResponse.
const (
	noResponderRetries = 2
	noResponderWait    = 250 * time.Millisecond
)

// PublisherOpt is an option of [NewPublisher].
type PublisherOpt func(*acks)

// WithAckTimeout bounds the wait for each asynchronous publish's answer
// (AppendAsync, SendAsync and the resends): past d the future fails with
// jetstream.ErrAsyncPublishTimeout. 0 or less: [DefaultAckTimeout].
func WithAckTimeout(d time.Duration) PublisherOpt {
	return func(a *acks) {
		if d > 0 {
			a.timeout = d
		}
	}
}

// WithMaxPending bounds how many asynchronous publishes wait for their
// answers at once: a send past it waits up to 200 ms for room, then
// fails with jetstream.ErrTooManyStalledMsgs. 0 or less:
// [DefaultMaxPending].
func WithMaxPending(n int) PublisherOpt {
	return func(a *acks) {
		if n > 0 {
			a.max = n
		}
	}
}

// acks is a Publisher's asynchronous publishing: each message goes out
// on the core connection with a reply subject of its own under one
// wildcard inbox subscription, and its answer, the stream's PubAck or
// API error, resolves the future registered under the reply's token
// (decodePubAck, which reads the acknowledgement without reflection).
//
// It keeps the client's rules (nats.go's PublishMsgAsync): a limit of
// publishes pending with a stall wait, a no-responders answer sent again
// twice, each answer awaited until a timeout; and one more: every
// future pending when the connection is lost (reconnecting or closed)
// fails at once, nats.ErrDisconnected or nats.ErrConnectionClosed, so
// that none is left hanging (docs/architecture.md, "The reconciler's own
// asynchronous publisher").
//
// It replaces the client's futures, channels, a timer per publish and
// encoding/json of each acknowledgement, ~10 % of a reconciler's CPU in
// an effect-dense first refold (docs/benchmarks.md).
type acks struct {
	nc      *nats.Conn
	timeout time.Duration
	max     int

	start   sync.Mutex  // held while the subscription is made
	ready   atomic.Bool // started, without the lock: every send asks
	started bool
	prefix  string // the reply subjects' ("<inbox>."), a token follows
	sub     *nats.Subscription

	mu      sync.Mutex
	next    uint64 // the last token given
	pending map[uint64]*ackFuture
	room    chan struct{} // closed when a stalled send may register
	expiry  *time.Timer   // fails the futures past their timeout (expire)
	armed   bool          // expiry is set to fire
	closed  error         // set when the connection closed: every send's answer
	buf     []byte        // builds reply subjects, under mu

	last string // the stream the last acknowledgement named (answer's goroutine only)
}

func newAcks(nc *nats.Conn, opts []PublisherOpt) *acks {
	a := &acks{nc: nc, timeout: DefaultAckTimeout, max: DefaultMaxPending}
	for _, o := range opts {
		o(a)
	}
	return a
}

// ackFuture is one asynchronous publish's future
// (jetstream.PubAckFuture): its answer arrives once, on ok or on err.
type ackFuture struct {
	msg     *nats.Msg
	ok      chan *jetstream.PubAck
	err     chan error
	sent    time.Time // when it was sent last (its timeout runs from there)
	reply   string
	retries int // no-responders answers sent again
}

func (f *ackFuture) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f *ackFuture) Err() <-chan error            { return f.err }
func (f *ackFuture) Msg() *nats.Msg               { return f.msg }

// ensure makes the inbox subscription and the watch of the connection's
// status, once.
func (a *acks) ensure() error {
	if a.ready.Load() {
		return nil
	}
	a.start.Lock()
	defer a.start.Unlock()
	if a.started {
		return nil
	}
	if a.nc.IsClosed() {
		return nats.ErrConnectionClosed
	}
	a.prefix = a.nc.NewInbox() + "."
	a.pending = make(map[uint64]*ackFuture)
	a.expiry = time.AfterFunc(time.Hour, a.expire)
	a.expiry.Stop()
	// Watch before subscribing: a loss from here on fails what is pending.
	status := a.nc.StatusChanged(nats.RECONNECTING, nats.CLOSED)
	sub, err := a.nc.Subscribe(a.prefix+"*", a.answer)
	if err != nil {
		a.nc.RemoveStatusListener(status)
		return err // not started: a later send tries again
	}
	a.sub = sub
	go a.watch(status)
	a.started = true
	a.ready.Store(true)
	return nil
}

// watch fails every pending future when the connection is lost:
// reconnecting (nats.ErrDisconnected: their answers, if any, went to the
// old connection) or closed (nats.ErrConnectionClosed, and every later
// send's too).
func (a *acks) watch(status chan nats.Status) {
	for s := range status {
		if s == nats.CLOSED {
			a.failAll(nats.ErrConnectionClosed, true)
			return
		}
		a.failAll(nats.ErrDisconnected, false)
	}
}

// failAll fails every pending future with err; closed: the connection
// closed for good.
func (a *acks) failAll(err error, closed bool) {
	a.mu.Lock()
	lost := a.pending
	a.pending = make(map[uint64]*ackFuture)
	if closed {
		a.closed = err
	}
	a.unstall()
	a.mu.Unlock()
	for _, f := range lost {
		f.err <- err
	}
}

// send publishes m with a reply subject of its own and returns its
// future. Errors: jetstream.ErrTooManyStalledMsgs when the pending limit
// left no room within the stall wait; the connection's refusal
// (nats.ErrConnectionClosed, nats.ErrMaxPayload, ...).
func (a *acks) send(m *nats.Msg) (*ackFuture, error) {
	if err := a.ensure(); err != nil {
		return nil, err
	}
	f := &ackFuture{msg: m, ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	tok, err := a.register(f)
	if err != nil {
		return nil, err
	}
	if err := a.nc.PublishMsg(&nats.Msg{Subject: m.Subject, Reply: f.reply, Header: m.Header, Data: m.Data}); err != nil {
		a.forget(tok)
		return nil, err
	}
	return f, nil
}

// register gives f a token and its reply subject, waiting up to the
// stall wait for room under the pending limit.
func (a *acks) register(f *ackFuture) (uint64, error) {
	var stall *time.Timer
	for {
		a.mu.Lock()
		if a.closed != nil {
			a.mu.Unlock()
			return 0, a.closed
		}
		if len(a.pending) < a.max {
			break
		}
		if a.room == nil {
			a.room = make(chan struct{})
		}
		room := a.room
		a.mu.Unlock()
		if stall == nil {
			stall = time.NewTimer(stallWait)
		}
		select {
		case <-room:
		case <-stall.C:
			return 0, jetstream.ErrTooManyStalledMsgs
		}
	}
	if stall != nil {
		stall.Stop() // not deferred: a deferred call costs every send
	}
	a.next++
	tok := a.next
	a.buf = strconv.AppendUint(append(a.buf[:0], a.prefix...), tok, 36)
	f.reply = string(a.buf)
	f.sent = time.Now()
	a.pending[tok] = f
	if !a.armed {
		a.armed = true
		a.expiry.Reset(a.timeout)
	}
	a.mu.Unlock()
	return tok, nil
}

// forget drops tok's future, unsent.
func (a *acks) forget(tok uint64) {
	a.mu.Lock()
	delete(a.pending, tok)
	a.unstall()
	a.mu.Unlock()
}

// unstall lets the stalled sends register when there is room. mu held.
func (a *acks) unstall() {
	if a.room != nil && len(a.pending) < a.max {
		close(a.room)
		a.room = nil
	}
}

// take removes tok's future from the pending ones; nil when it is not
// pending (answered, timed out or failed before).
func (a *acks) take(tok uint64) *ackFuture {
	a.mu.Lock()
	f := a.pending[tok]
	if f != nil {
		delete(a.pending, tok)
		a.unstall()
	}
	a.mu.Unlock()
	return f
}

// expire fails the futures whose answer did not come within the timeout
// (jetstream.ErrAsyncPublishTimeout) and sets itself to fire at the
// next one's deadline.
func (a *acks) expire() {
	var late []*ackFuture
	a.mu.Lock()
	now := time.Now()
	var next time.Duration
	for tok, f := range a.pending {
		left := a.timeout - now.Sub(f.sent)
		if left <= 0 {
			delete(a.pending, tok)
			late = append(late, f)
			continue
		}
		if next == 0 || left < next {
			next = left
		}
	}
	a.armed = next > 0
	if a.armed {
		a.expiry.Reset(next)
	}
	a.unstall()
	a.mu.Unlock()
	for _, f := range late {
		f.err <- jetstream.ErrAsyncPublishTimeout
	}
}

// answer takes a reply of the stream (the inbox subscription's handler:
// one at a time).
func (a *acks) answer(m *nats.Msg) {
	if len(m.Subject) <= len(a.prefix) {
		return
	}
	tok, err := strconv.ParseUint(m.Subject[len(a.prefix):], 36, 64)
	if err != nil {
		return
	}
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		a.noResponders(tok)
		return
	}
	f := a.take(tok)
	if f == nil {
		return
	}
	ack, err := a.decode(m.Data)
	if err != nil {
		f.err <- err
		return
	}
	f.ok <- ack
}

// noResponders takes the answer that no stream listens on the subject:
// tok's message is sent again after noResponderWait, twice, as the
// client would (a stream being created, a cluster electing its leader);
// then its future fails with jetstream.ErrNoStreamResponse.
func (a *acks) noResponders(tok uint64) {
	a.mu.Lock()
	f := a.pending[tok]
	if f == nil {
		a.mu.Unlock()
		return
	}
	if f.retries >= noResponderRetries {
		delete(a.pending, tok)
		a.unstall()
		a.mu.Unlock()
		f.err <- jetstream.ErrNoStreamResponse
		return
	}
	f.retries++
	f.sent = time.Now().Add(noResponderWait)
	a.mu.Unlock()
	time.AfterFunc(noResponderWait, func() {
		a.mu.Lock()
		still := a.pending[tok] == f
		a.mu.Unlock()
		if !still {
			return
		}
		m := f.msg
		if err := a.nc.PublishMsg(&nats.Msg{Subject: m.Subject, Reply: f.reply, Header: m.Header, Data: m.Data}); err != nil {
			if a.take(tok) == f {
				f.err <- err
			}
		}
	})
}

// decode reads a publish's answer as the client does: the stream's
// API error, or its acknowledgement, or jetstream.ErrInvalidJSAck for
// anything else (no stream named).
func (a *acks) decode(data []byte) (*jetstream.PubAck, error) {
	r, ok := decodePubAck(data, a.last)
	if !ok {
		r = decodePubAckJSON(data)
	}
	if r.apiErr != nil {
		return nil, r.apiErr
	}
	if r.invalid || r.ack.Stream == "" {
		return nil, jetstream.ErrInvalidJSAck
	}
	a.last = r.ack.Stream
	ack := r.ack
	return &ack, nil
}

// pubAckReply is a publish's answer, read.
type pubAckReply struct {
	ack     jetstream.PubAck
	apiErr  *jetstream.APIError
	invalid bool // not a JSON answer at all
}

// decodePubAckJSON reads data with encoding/json, the client's way
// (its pubAckResponse): the answers decodePubAck leaves.
func decodePubAckJSON(data []byte) pubAckReply {
	var resp struct {
		Error *jetstream.APIError `json:"error,omitempty"`
		*jetstream.PubAck
	}
	if err := json.Unmarshal(data, &resp); err != nil {
		return pubAckReply{invalid: true}
	}
	r := pubAckReply{apiErr: resp.Error}
	if resp.PubAck != nil {
		r.ack = *resp.PubAck
	}
	return r
}
