package tracing

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// A span's context crosses a NATS header as a lower-case traceparent and
// comes back as the parent of the reader's span.
func TestHeaderRoundTrip(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tr := Tracer(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	ctx, pub := Start(context.Background(), tr, "publish want")
	h := nats.Header{}
	Inject(ctx, h)
	if len(h["traceparent"]) != 1 || h["traceparent"][0] != Traceparent(ctx) {
		t.Fatalf("header %v, want one lower-case traceparent", h)
	}
	if got := Remote(h); got.TraceID() != pub.SpanContext().TraceID() || got.SpanID() != pub.SpanContext().SpanID() || !got.IsRemote() {
		t.Errorf("Remote = %v, want the publisher's span, remote", got)
	}
	_, fold := Start(Extract(context.Background(), h), tr, "fold want")
	fold.End()
	pub.End()
	spans := rec.Ended()
	if len(spans) != 2 || spans[0].Parent().SpanID() != pub.SpanContext().SpanID() {
		t.Errorf("the reader's span is not the publisher's child: %v", spans)
	}
}

// With no tracer nothing is started, and a message without traceparent
// leaves the context as it is.
func TestOff(t *testing.T) {
	ctx := context.Background()
	if c, s := Start(ctx, nil, "x"); c != ctx || s.SpanContext().IsValid() || s.IsRecording() {
		t.Errorf("Start with a nil tracer started something")
	}
	if Tracer(nil) != nil {
		t.Error("Tracer(nil) is not nil")
	}
	if Extract(ctx, nats.Header{}) != ctx || Traceparent(ctx) != "" {
		t.Error("no traceparent changed the context or made one")
	}
	h := nats.Header{}
	Inject(ctx, h)
	if len(h) != 0 {
		t.Errorf("Inject without a span set %v", h)
	}
	if trace.SpanContextFromContext(Extract(ctx, nats.Header{Header: []string{"garbage"}})).IsValid() {
		t.Error("a malformed traceparent gave a valid span context")
	}
}
