package engine

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshfold/meshfold/internal/tracing"
	"github.com/meshfold/meshfold/store"
)

// recoveryTrace is a session's recovery as spans (docs/operations.md,
// "Traces"): one `recover partition` span for the whole refold, from the
// session's start to the end of its recovery, with its counts and the
// sequences it refolded, and a `publish <kind>` span for each effect it
// publishes, as the live fold's, which ends at the stream's ack and whose
// traceparent the message carries. The refold's events get no span each:
// a restart's tail is thousands of events, a first refold millions, most
// of them folded and traced by the run before.
//
// An effect's publish span is a child of its cause's traceparent (the
// want's trace goes on across the restart: `publish want`, then the plan
// the recovery publishes, then the node's `apply plan`), linked to the
// recovery's span; a cause that carried none puts it under the recovery's
// span. A session whose recovery refolds no message makes no span.
//
// Nil when tracing is off: every method of a nil recoveryTrace does
// nothing. It is the session's, used from its goroutine only.
type recoveryTrace struct {
	tr          trace.Tracer
	partition   int
	began       time.Time
	checkpoint  uint64 // the sequence the session's snapshot covered
	lastAtStart uint64
	// span is the recovery's, started (at began) when the first message
	// is refolded; ctx carries it.
	span trace.Span
	ctx  context.Context
	// first and last are the sequences of the first and last message
	// refolded; events counts them, effects the effects their folds made,
	// published those the recovery published and the stream acknowledged.
	first, last                uint64
	events, effects, published int
	// held is the span of a publish the connection's pending limit
	// refused (errStalled), id its message id: the send of that message
	// again takes it (the message carries its traceparent already).
	held   trace.Span
	heldID string
}

// errSessionStopped is why a recovery's span ended with its session
// stopped (gracefully) before the recovery did.
var errSessionStopped = errors.New("stopped")

// newRecoveryTrace returns the recovery trace of a session of partition
// part that recovers from checkpoint to lastAtStart, nil when tr is nil
// (tracing off).
func newRecoveryTrace(tr trace.Tracer, part int, began time.Time, checkpoint, lastAtStart uint64) *recoveryTrace {
	if tr == nil {
		return nil
	}
	return &recoveryTrace{tr: tr, partition: part, began: began, checkpoint: checkpoint, lastAtStart: lastAtStart}
}

// start starts the recovery's span, once: a root, dated from the
// session's start.
func (t *recoveryTrace) start() {
	if t.span != nil {
		return
	}
	t.ctx, t.span = t.tr.Start(context.Background(), "recover partition", trace.WithNewRoot(), trace.WithTimestamp(t.began),
		trace.WithAttributes(tracing.Partition.Int(t.partition), tracing.SeqAttr(tracing.Checkpoint, t.checkpoint),
			tracing.SeqAttr(tracing.StreamLast, t.lastAtStart)))
}

// refolded notes the message at seq refolded, whose fold made effects
// effects.
func (t *recoveryTrace) refolded(seq uint64, effects int) {
	if t == nil {
		return
	}
	t.start()
	if t.events == 0 {
		t.first = seq
	}
	t.last = seq
	t.events++
	t.effects += effects
}

// publishing starts the span of x's publish as message id, and puts its
// traceparent on pm, before its send. A span held for id (stalled) is
// taken again; one held for another message is ended (its effect was
// not sent after all: a session that restarts sends it again).
func (t *recoveryTrace) publishing(x toPublish, id string, pm *store.Prepared) trace.Span {
	if t == nil || pm == nil {
		return nil
	}
	if t.held != nil {
		span := t.held
		t.held = nil
		if t.heldID == id {
			return span
		}
		span.SetStatus(codes.Error, "not sent")
		span.End()
	}
	t.start()
	parent := t.ctx
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(tracing.Node.String(x.e.Node), tracing.Kind.String(string(x.e.Kind)), tracing.SeqAttr(tracing.Cause, x.e.Cause),
			tracing.Recovered.Bool(true))}
	if x.tp != "" {
		if c := tracing.FromTraceparent(context.Background(), x.tp); trace.SpanContextFromContext(c).IsValid() {
			parent = c
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: t.span.SpanContext()}))
		}
	}
	ctx, span := t.tr.Start(parent, "publish "+string(x.e.Kind), opts...)
	pm.SetTraceparent(tracing.Traceparent(ctx))
	return span
}

// stalled keeps span, of the publish of message id that the connection's
// pending limit refused, for the send of id again.
func (t *recoveryTrace) stalled(id string, span trace.Span) {
	if t == nil || span == nil {
		return
	}
	t.held, t.heldID = span, id
}

// answered ends span with the stream's ack (its sequence), or err.
func (t *recoveryTrace) answered(span trace.Span, ack *jetstream.PubAck, err error) {
	if t == nil || span == nil {
		return
	}
	switch {
	case err != nil:
		span.SetStatus(codes.Error, err.Error())
	case ack != nil:
		t.published++
		span.SetAttributes(tracing.SeqAttr(tracing.Seq, ack.Sequence), attribute.Bool("meshfold.duplicate", ack.Duplicate))
	}
	span.End()
}

// end ends the recovery's span once the recovery ended, stored being the
// effects its folds made that were found stored (or superseded), not
// published again; err, when not nil, is why the session ended first.
func (t *recoveryTrace) end(stored int, err error) {
	if t == nil || t.span == nil {
		return
	}
	if t.held != nil {
		t.held.SetStatus(codes.Error, "not sent")
		t.held.End()
		t.held = nil
	}
	attrs := []attribute.KeyValue{tracing.Events.Int(t.events), tracing.Effects.Int(t.effects), tracing.Published.Int(t.published),
		tracing.SeqAttr(tracing.From, t.first), tracing.SeqAttr(tracing.To, t.last)}
	if err == nil {
		attrs = append(attrs, tracing.Stored.Int(stored))
	} else {
		t.span.SetStatus(codes.Error, "session ended before its recovery did: "+err.Error())
	}
	t.span.SetAttributes(attrs...)
	t.span.End()
	t.span = nil
}
