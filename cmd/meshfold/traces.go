package main

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/meshfold/meshfold/internal/tracing/otlp"
)

// traceFlush bounds the export of the spans still batched when a
// command stops.
const traceFlush = 5 * time.Second

// startTracing starts the tracer provider --otlp-endpoint and the OTEL_*
// variables ask for (internal/tracing/otlp), as service (service.name
// unless OTEL_SERVICE_NAME says otherwise). It returns nil when tracing
// is off, and stop, which exports what is batched (within traceFlush);
// stop is never nil.
//
// Errors: an --otlp-endpoint that is not an http(s) URL (a usage error);
// a malformed OTEL_* variable.
func (a *app) startTracing(ctx context.Context, service string, log *slog.Logger) (trace.TracerProvider, func(), error) {
	cfg := otlp.Config{Endpoint: a.otlpEndpoint, Service: service}
	p, err := otlp.Start(ctx, cfg)
	if err != nil {
		return nil, func() {}, withCode(exitUsage, err)
	}
	if p == nil {
		return nil, func() {}, nil
	}
	log.Info("tracing: spans exported over OTLP/HTTP", "endpoint", cfg.Endpoint, "service", service)
	return p.TracerProvider(), func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), traceFlush)
		defer cancel()
		if err := p.Shutdown(sctx); err != nil {
			log.Warn("tracing: spans not exported at stop", "err", err)
		}
	}, nil
}
