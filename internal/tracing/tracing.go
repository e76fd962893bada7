package tracing

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Header is the NATS header a span's W3C trace context travels in,
// lower-case as the W3C spells it (NATS headers are case-sensitive).
const Header = "traceparent"

// Name is the instrumentation scope of meshfold's tracers.
const Name = "github.com/meshfold/meshfold"

// The attributes that link a span to the stream. Seq is the stream
// sequence of the event the span folds, applies or stored; Cause the
// sequence of the event that caused it (a plan's or a knock's cause,
// the plan a settle, refusal or filled is judged by).
const (
	Node   = attribute.Key("meshfold.node")
	Kind   = attribute.Key("meshfold.kind")
	Seq    = attribute.Key("meshfold.seq")
	Cause  = attribute.Key("meshfold.cause")
	Plan   = attribute.Key("meshfold.plan")
	Knock  = attribute.Key("meshfold.knock")
	Module = attribute.Key("meshfold.module")
	Build  = attribute.Key("meshfold.build")
	Path   = attribute.Key("meshfold.path")
	Writer = attribute.Key("meshfold.writer")
	Reason = attribute.Key("meshfold.reason")
)

// The attributes of a reconciler's `recover partition` span: its
// partition, the sequence its snapshot covered (Checkpoint) and the
// stream's last when it began (StreamLast), the first and last sequence
// it refolded (From, To), the messages refolded (Events), the effects
// their folds made (Effects), those found stored and not published again
// (Stored) and those it published (Published). Recovered marks a
// publish span of an effect a recovery published.
const (
	Partition  = attribute.Key("meshfold.partition")
	Checkpoint = attribute.Key("meshfold.checkpoint")
	StreamLast = attribute.Key("meshfold.stream_last")
	From       = attribute.Key("meshfold.from")
	To         = attribute.Key("meshfold.to")
	Events     = attribute.Key("meshfold.events")
	Effects    = attribute.Key("meshfold.effects")
	Stored     = attribute.Key("meshfold.stored")
	Published  = attribute.Key("meshfold.published")
	Recovered  = attribute.Key("meshfold.recovered")
)

// SeqAttr is the attribute k with a stream sequence as its value.
func SeqAttr(k attribute.Key, seq uint64) attribute.KeyValue { return k.Int64(int64(seq)) }

// propagator is W3C trace context alone: the header is `traceparent`
// whatever OTEL_PROPAGATORS says.
var propagator propagation.TraceContext

// carrier adapts a nats.Header to the propagator, keeping the header's
// case (http.Header would canonicalise it to "Traceparent").
type carrier nats.Header

func (c carrier) Get(key string) string { return nats.Header(c).Get(key) }
func (c carrier) Set(key, value string) { nats.Header(c).Set(key, value) }
func (c carrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Extract returns ctx carrying the remote span context of h's
// traceparent, or ctx unchanged when h has none (or an invalid one).
func Extract(ctx context.Context, h nats.Header) context.Context {
	if h.Get(Header) == "" {
		return ctx
	}
	return propagator.Extract(ctx, carrier(h))
}

// FromTraceparent returns ctx carrying the remote span context of
// traceparent tp (a message's, kept), or ctx unchanged when tp is empty
// or invalid.
func FromTraceparent(ctx context.Context, tp string) context.Context {
	if tp == "" {
		return ctx
	}
	return propagator.Extract(ctx, carrier(nats.Header{Header: []string{tp}}))
}

// Remote returns the span context of h's traceparent; not valid when h
// has none.
func Remote(h nats.Header) trace.SpanContext {
	return trace.SpanContextFromContext(Extract(context.Background(), h))
}

// Traceparent returns the traceparent of ctx's span, empty when ctx
// carries no valid span context.
func Traceparent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	h := nats.Header{}
	propagator.Inject(ctx, carrier(h))
	return h.Get(Header)
}

// Inject sets h's traceparent to ctx's span; it leaves h as it is when
// ctx carries no valid span context. h must not be nil.
func Inject(ctx context.Context, h nats.Header) {
	if tp := Traceparent(ctx); tp != "" {
		h.Set(Header, tp)
	}
}

// Tracer returns tp's tracer for meshfold, nil when tp is nil: a role
// whose tracer is nil traces nothing.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(Name)
}

// Start starts a span named name under ctx's span with attrs; with a nil
// tr it starts nothing and returns ctx and a span that records nothing
// (trace.SpanFromContext of a context without one), for which End and
// SetAttributes cost nothing.
func Start(ctx context.Context, tr trace.Tracer, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if tr == nil {
		return ctx, noSpan
	}
	return tr.Start(ctx, name, opts...)
}

// noSpan is the span of a nil tracer.
var noSpan = trace.SpanFromContext(context.Background())
