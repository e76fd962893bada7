// Package tracing carries a want's trace across the mesh: the W3C trace
// context of a span travels in a NATS message's `traceparent` header, and
// the roles (engine, node, provision) start their spans under it.
//
// It holds only what the shell's roles share: the header carrier, the
// span attribute keys that link a span to the stream (an event's
// sequence, its cause), and [Start], which does nothing when a role's
// tracer is nil, so that tracing off costs a nil check. It imports the
// OpenTelemetry API only; the SDK and the OTLP exporter are set up by
// the command ([otlp.Start] in the package below). The pure core
// (reconcile/) never imports it: docs/operations.md, "Traces", lists the
// spans.
package tracing
