package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"

	"github.com/nats-io/nuid"

	"github.com/meshfold/meshfold/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrConflict: the stream refused a publish because its expected last
// subject sequence was stale (someone else published on that subject
// since). Nothing was stored. Test with errors.Is: every error of this
// package a stale expectation caused matches it, and so does the server's
// raw reply once passed through [ServerError] (the error of an
// asynchronous publish's future).
var ErrConflict = errors.New("store: conflict: the subject's last sequence is not the expected one")

// conflictError is the server's wrong-last-sequence reply: it matches
// [ErrConflict] through errors.Is and unwraps to the reply, so errors.As
// still finds the *jetstream.APIError.
type conflictError struct{ reply error }

func (e *conflictError) Error() string        { return "store: conflict: " + e.reply.Error() }
func (e *conflictError) Unwrap() error        { return e.reply }
func (e *conflictError) Is(target error) bool { return target == ErrConflict }

// ServerError returns err, a server's reply, so that it matches
// [ErrConflict] through errors.Is when it is a wrong-last-sequence reply:
// code 10071 on a single replica, 10164 on a replicated stream. It is the
// one place that maps them; a refusal for lack of room comes back as
// [StorageFullError] makes it (matching [ErrStorageFull]); nil and other
// errors come back unchanged.
// (jetstream.ErrKeyExists must not be used for this: it matches every
// 10071, and misses 10164. And errors.Is cannot match the raw reply to a
// sentinel of ours: it consults the reply's own Is, which compares one
// error code.)
func ServerError(err error) error {
	var apiErr *jetstream.APIError
	if err == nil || errors.Is(err, ErrConflict) || !errors.As(err, &apiErr) {
		return err
	}
	if full := StorageFullError(err); full != err {
		return full
	}
	if apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant {
		return &conflictError{err}
	}
	if err.Error() == "nats: "+apiErr.Error() {
		// nats.go wraps a publish's API error in "nats: %w", and the
		// API error's own text begins "nats: ": "nats: nats: API error"
		// (a fresh user's finding V9). The reply alone says it all.
		return apiErr
	}
	return err
}

// errCodeDuplicateInProcess is the server's reply to a publish whose
// message id another publish of the same id, not yet stored, carries:
// "duplicate message id is in process" (10158).
const errCodeDuplicateInProcess jetstream.ErrorCode = 10158

// DuplicateInProcess reports whether err is the server's reply that a
// publish of the same message id is being stored (10158): nothing failed,
// another publisher's copy of the same message is under way, and a
// retry's is a duplicate.
func DuplicateInProcess(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeDuplicateInProcess
}

// Permanent reports whether a publish or a put failed for a reason a
// retry cannot change: the message is over the server's max_payload
// (nats.ErrMaxPayload, refused by the client before sending) or the
// stream's or bucket's maximum message size (the server's 10054), or the
// payload is invalid (events.ErrInvalid). No server, no leader, a
// timeout, a conflict or a denied permission are not permanent: an
// operator or a failover can change them.
func Permanent(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, events.ErrInvalid) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum
}

// headerTraceparent is tracing.Header, which store does not import (it
// links no OpenTelemetry package).
const headerTraceparent = "traceparent"

// Publisher appends events to the stream on their plain subjects
// (<prefix>.<node>.<kind>), or, one made [Publisher.As] a named
// operator, operator events on that operator's named subjects. It is
// safe for concurrent use.
type Publisher struct {
	js       jetstream.JetStream
	subj     events.Subjects
	denied   *denials
	operator string
	acks     *acks // the asynchronous publishes'
}

// NewPublisher returns a Publisher for the stream whose subjects subj
// builds. Its asynchronous publishes go out on js's connection, each
// awaited for its answer up to [WithAckTimeout], at most
// [WithMaxPending] at once.
func NewPublisher(js jetstream.JetStream, subj events.Subjects, opts ...PublisherOpt) *Publisher {
	return &Publisher{js: js, subj: subj, denied: watchDenials(js.Conn()), acks: newAcks(js.Conn(), opts)}
}

// As returns a Publisher that appends operator events (events.OperatorKinds)
// on the named subjects of operator (events.Subjects.Named), the only
// ones a named operator's credentials may publish, and refuses one whose
// `by` is not operator before publishing it (events.ErrNotPublisher).
// Other kinds keep their plain subjects. Empty: p itself.
func (p *Publisher) As(operator string) *Publisher {
	if operator == "" {
		return p
	}
	q := *p
	q.operator = operator
	return &q
}

// Ack is the stream's acknowledgement of an append.
type Ack struct {
	// Seq is the stream sequence of the stored message (of the original
	// message when Duplicate).
	Seq uint64
	// Duplicate: a message with the same id was stored within the dedup
	// window; nothing new was stored.
	Duplicate bool
}

// AppendOpt is an option of [Publisher.Append].
type AppendOpt func(*appendOpts)

type appendOpts struct {
	signer    *Signer
	msgID     string
	expect    bool
	expectSeq uint64
	header    nats.Header
}

// WithMsgID sets the Nats-Msg-Id header: the stream drops a second message
// with the same id within its dedup window and acknowledges it with
// Ack.Duplicate.
func WithMsgID(id string) AppendOpt { return func(o *appendOpts) { o.msgID = id } }

// WithHeader adds header key with value to the message: what a reader
// of the stored message learns besides its payload (a rollout step's
// why). The signature, when signed, does not cover it.
func WithHeader(key, value string) AppendOpt {
	return func(o *appendOpts) {
		if o.header == nil {
			o.header = nats.Header{}
		}
		o.header.Set(key, value)
	}
}

// WithSigner signs the message with s (see [Signer.Sign]): the signature
// headers cover the node, the kind, the message id and the payload. It
// needs [WithMsgID].
func WithSigner(s *Signer) AppendOpt { return func(o *appendOpts) { o.signer = s } }

// WithTraceparent sets the message's W3C trace context header
// (tracing.Header, "traceparent") to tp: the span that published it, under
// which its readers start theirs. Empty sets nothing. The header is not
// signed: it says where to look, never what to do.
func WithTraceparent(tp string) AppendOpt {
	if tp == "" {
		return func(*appendOpts) {}
	}
	return WithHeader(headerTraceparent, tp)
}

// WithExpectLastSubjectSeq sets Nats-Expected-Last-Subject-Sequence on the
// message's own subject: the stream stores it only if the newest message
// of that node and kind has sequence seq; 0 means "no message on that
// subject yet". Otherwise the append fails with [ErrConflict].
func WithExpectLastSubjectSeq(seq uint64) AppendOpt {
	return func(o *appendOpts) { o.expect, o.expectSeq = true, seq }
}

// prepare validates and encodes one append. The message id and the
// expectation go into the message's headers here, as the client's
// publish options would set them (jetstream.MsgIDHeader,
// jetstream.ExpectedLastSubjSeqHeader, the same names and values), so
// that a publish takes no option: each option was a closure, and the
// client made a struct of them and set the headers again on every
// publish, ~2 % of a reconciler's CPU in an effect-dense first refold
// (docs/architecture.md, "The publish path's headers set once").
func (p *Publisher) prepare(ctx context.Context, node string, payload events.Payload, opts []AppendOpt) (*nats.Msg, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if payload == nil {
		return nil, &events.FieldError{Field: "payload", Err: events.ErrMissing}
	}
	if !events.ValidName(node) && (node != events.FleetNode || payload.Kind() != events.KindJournal) {
		return nil, &events.FieldError{Field: "node", Value: node, Err: events.ErrBadName}
	}
	kind := payload.Kind()
	// Validate also refuses an unstamped payload (v 0, at zero).
	if err := payload.Validate(); err != nil {
		return nil, fmt.Errorf("append %s %s: %w", node, kind, err)
	}
	data, err := events.Encode(payload)
	if err != nil {
		return nil, fmt.Errorf("append %s %s: encode: %w", node, kind, err)
	}
	var o appendOpts
	for _, opt := range opts {
		opt(&o)
	}
	subject := p.subj.Event(node, kind)
	if p.operator != "" && kind.Operator() {
		if err := events.Attribute(payload, p.operator); err != nil {
			return nil, fmt.Errorf("append %s %s: %w", node, kind, err)
		}
		subject = p.subj.Named(node, kind, p.operator)
	}
	msg := &nats.Msg{Subject: subject, Data: data, Header: o.header}
	if o.signer != nil && o.msgID == "" {
		return nil, fmt.Errorf("append %s %s: a signed effect needs a message id", node, kind)
	}
	if msg.Header == nil && (o.msgID != "" || o.expect) {
		// The id, the expectation and the two signature headers.
		msg.Header = make(nats.Header, 4)
	}
	if o.msgID != "" {
		msg.Header[jetstream.MsgIDHeader] = []string{o.msgID}
	}
	if o.expect {
		setExpectation(msg.Header, o.expectSeq)
	}
	if o.signer != nil {
		if err := o.signer.Sign(msg.Header, node, kind, o.msgID, data); err != nil {
			return nil, err
		}
	}
	return msg, nil
}

// setExpectation sets h's Nats-Expected-Last-Subject-Sequence to seq, as
// jetstream.WithExpectLastSequencePerSubject would at the publish.
func setExpectation(h nats.Header, seq uint64) {
	h[jetstream.ExpectedLastSubjSeqHeader] = []string{strconv.FormatUint(seq, 10)}
}

// Append validates payload (it must already be stamped, see events.Stamp),
// publishes it on <prefix>.<node>.<kind> and returns once the stream has
// acknowledged it.
//
// Errors: a validation error matching events.ErrInvalid before anything is
// published; an error wrapping [ErrConflict] when a
// [WithExpectLastSubjectSeq] expectation was stale; one wrapping
// nats.ErrPermissionViolation as soon as the server denies the publish
// (not after the timeout); ctx's error; the publish's error otherwise (no
// stream, timeout).
func (p *Publisher) Append(ctx context.Context, node string, payload events.Payload, opts ...AppendOpt) (Ack, error) {
	msg, err := p.prepare(ctx, node, payload, opts)
	if err != nil {
		return Ack{}, err
	}
	gctx, release := p.denied.guard(ctx, subjectIs(msg.Subject))
	defer release()
	pa, err := p.js.PublishMsg(gctx, msg)
	if err != nil {
		if cause := context.Cause(gctx); errors.Is(cause, nats.ErrPermissionViolation) {
			return Ack{}, fmt.Errorf("append %s: %w", msg.Subject, cause)
		}
		return Ack{}, fmt.Errorf("append %s: %w", msg.Subject, ServerError(err))
	}
	return Ack{Seq: pa.Sequence, Duplicate: pa.Duplicate}, nil
}

// Transient reports whether an append failed for a reason that passes by
// itself: the stream's answer did not come ([Unanswered]: no stream
// responded or no leader, as while a cluster elects one or a server
// restarts; no responders; a timeout, an asynchronous publish's too,
// jetstream.ErrAsyncPublishTimeout; the connection disconnected or
// reconnecting, nats.ErrDisconnected being what every asynchronous
// publish pending at a reconnect fails with; a server temporarily
// unavailable). Conflicts, denied permissions, invalid or oversized
// payloads ([Permanent]) are not transient: retrying cannot help; nor is
// a closed connection (nats.ErrConnectionClosed), which never reopens.
func Transient(err error) bool {
	if err == nil || Permanent(err) || errors.Is(err, ErrConflict) || errors.Is(err, nats.ErrPermissionViolation) {
		return false
	}
	return Unanswered(err)
}

// AppendRetrying is [Append] for a user's verb: it retries [Transient]
// failures (a cluster electing a leader) until ctx is done, through
// [RideOut], each attempt bounded by [RideAttempt]. Every attempt carries
// the same message id (a random one unless opts set it), so an append
// whose acknowledgement was lost is stored once.
//
// Errors: those of Append that are not transient, at once; when ctx
// ends, a [*NoLeaderError] (matching [ErrNoLeader]) when the last attempt
// found no leader, else the last transient error.
func (p *Publisher) AppendRetrying(ctx context.Context, node string, payload events.Payload, opts ...AppendOpt) (Ack, error) {
	var o appendOpts
	for _, opt := range opts {
		opt(&o)
	}
	if o.msgID == "" {
		opts = append(opts, WithMsgID(nuid.Next()))
	}
	return RideOut(ctx, "", func(ctx context.Context) (Ack, error) {
		return p.Append(ctx, node, payload, opts...)
	})
}

// Prepared is an append validated, encoded and, with [WithSigner], signed
// by [Publisher.Prepare], not yet sent: [Publisher.SendAsync] sends it,
// once.
type Prepared struct {
	msg *nats.Msg // its headers hold its message id and signature
}

// Prepare does the work of [Publisher.AppendAsync] before the send:
// validation, encoding, the options' headers and the signature. It lets
// that work (an ed25519 signature is ~25 µs) be done ahead, on another
// goroutine, of a send whose expectation ([WithExpectLastSubjectSeq],
// which the signature does not cover) is known only later.
//
// Errors: those AppendAsync returns before sending.
func (p *Publisher) Prepare(ctx context.Context, node string, payload events.Payload, opts ...AppendOpt) (*Prepared, error) {
	msg, err := p.prepare(ctx, node, payload, opts)
	if err != nil {
		return nil, err
	}
	return &Prepared{msg: msg}, nil
}

// SetTraceparent sets pr's traceparent header (tracing.Header) to tp
// before pr is sent: a publish whose span starts at its send (a
// reconciler's recovery prepares its effects ahead). The signature does
// not cover it.
func (pr *Prepared) SetTraceparent(tp string) {
	if pr.msg.Header == nil {
		pr.msg.Header = nats.Header{}
	}
	pr.msg.Header.Set(headerTraceparent, tp)
}

// SendAsync sends pr as [Publisher.AppendAsync] would have, with the
// expectation of [WithExpectLastSubjectSeq] when expect, and returns
// its future, answered as [Publisher.AppendAsync]'s. pr must not be sent
// twice.
//
// Errors: jetstream.ErrTooManyStalledMsgs or the connection's refusal,
// as AppendAsync's.
func (p *Publisher) SendAsync(pr *Prepared, expect bool, seq uint64) (jetstream.PubAckFuture, error) {
	if expect {
		if pr.msg.Header == nil {
			pr.msg.Header = make(nats.Header, 1)
		}
		setExpectation(pr.msg.Header, seq)
	}
	f, err := p.acks.send(pr.msg)
	if err != nil {
		return nil, fmt.Errorf("append %s: %w", pr.msg.Subject, err)
	}
	return f, nil
}

// AppendAsync is [Append] without waiting: it validates and publishes, and
// the returned future yields the stream's ack or error. A stale expectation
// arrives on the future's Err channel as the server's error (a
// *jetstream.APIError): pass it through [ServerError] and test it with
// errors.Is. Wait for every future before treating the appends as
// stored. Every future is answered: the stream's ack or API error;
// jetstream.ErrAsyncPublishTimeout past the Publisher's ack timeout
// ([WithAckTimeout]); nats.ErrDisconnected when the connection was lost
// and reconnects, nats.ErrConnectionClosed when it closed;
// jetstream.ErrNoStreamResponse when no stream listened to three sends
// 250 ms apart; jetstream.ErrInvalidJSAck for an answer that is neither.
// (The futures are the Publisher's own, not js's:
// js.PublishAsyncComplete does not wait for them.)
//
// Errors (returned directly): validation errors matching events.ErrInvalid,
// ctx's error, jetstream.ErrTooManyStalledMsgs when [WithMaxPending]
// publishes stayed pending for 200 ms, or the connection's refusal
// (nats.ErrConnectionClosed, nats.ErrMaxPayload).
func (p *Publisher) AppendAsync(ctx context.Context, node string, payload events.Payload, opts ...AppendOpt) (jetstream.PubAckFuture, error) {
	msg, err := p.prepare(ctx, node, payload, opts)
	if err != nil {
		return nil, err
	}
	f, err := p.acks.send(msg)
	if err != nil {
		return nil, fmt.Errorf("append %s: %w", msg.Subject, err)
	}
	return f, nil
}

// ResendAsync is [Publisher.SendAsync] for pr sent before, whose answer
// was lost (the client's server went away, the stream changed leaders):
// it sends a copy of pr's message (the same subject, payload, message id
// and signature), with the expectation of [WithExpectLastSubjectSeq] when
// expect, and returns its future. A copy stored first is answered as a
// duplicate within the stream's dedup window.
//
// Errors: as [Publisher.SendAsync]'s.
func (p *Publisher) ResendAsync(pr *Prepared, expect bool, seq uint64) (jetstream.PubAckFuture, error) {
	// The send sets its expectation in the header: a clone's.
	m := &nats.Msg{Subject: pr.msg.Subject, Data: pr.msg.Data, Header: maps.Clone(pr.msg.Header)}
	return p.SendAsync(&Prepared{msg: m}, expect, seq)
}

// ResendMsgAsync sends again a copy of m, a message sent before through
// [Publisher.AppendAsync] (its future's Msg) whose answer was lost: the
// same subject, payload and headers, the message id among them, so that
// a copy stored first is answered as a duplicate within the stream's
// dedup window.
//
// Errors: as [Publisher.SendAsync]'s.
func (p *Publisher) ResendMsgAsync(m *nats.Msg) (jetstream.PubAckFuture, error) {
	c := &nats.Msg{Subject: m.Subject, Data: m.Data, Header: maps.Clone(m.Header)}
	f, err := p.acks.send(c)
	if err != nil {
		return nil, fmt.Errorf("append %s: %w", m.Subject, err)
	}
	return f, nil
}
