package engine_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/engine/enginetest"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// countingExporter counts the spans exported, by name, and drops them.
type countingExporter struct {
	spans, recovers, publishes atomic.Int64
}

func (e *countingExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	for _, s := range spans {
		e.spans.Add(1)
		switch s.Name() {
		case "recover partition":
			e.recovers.Add(1)
		case "publish plan", "publish knock", "publish journal":
			e.publishes.Add(1)
		}
	}
	return nil
}

func (e *countingExporter) Shutdown(context.Context) error { return nil }

// BenchmarkRecoveryTraced is a cold refold (no snapshot) of 100,000
// events over 1,000 nodes with tracing off and on (spans batched to an
// exporter that counts and drops them: the SDK's cost, not a
// collector's), from the reconciler's start to its graceful stop:
//
//   - stored: the history with its effects stored (a crash before any
//     checkpoint): a `recover partition` span a partition, no publish.
//   - unstored: its inputs only (a first refold): every plan the refold
//     makes is published, each a `publish plan` span.
//
// spans is what one recovery exported, for events refolded (the rest
// of spans beyond recover-spans and publish-spans are the live `fold
// plan` of the plans read back once the recovery ended).
//
//	go test ./engine -run '^$' -bench RecoveryTraced -benchtime 1x
func BenchmarkRecoveryTraced(b *testing.B) {
	h := enginetest.Simulate(100_000, 1_000)
	for _, c := range []struct {
		name string
		h    *enginetest.History
	}{{"stored", h}, {"unstored", h.Inputs()}} {
		for _, traced := range []bool{false, true} {
			name := c.name + "/off"
			if traced {
				name = c.name + "/on"
			}
			b.Run(name, func(b *testing.B) {
				n := len(c.h.Msgs)
				for range b.N {
					_, _, js, _, cfg := storetest.StartStream(b, store.StreamConfig{})
					sealed(b, js, cfg, c.h).Load(b, js)
					exp := &countingExporter{}
					var tp trace.TracerProvider
					var sdk *sdktrace.TracerProvider
					if traced {
						sdk = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
						tp = sdk
					}
					took, cpu := timed(b, func() time.Duration {
						return foldAllWith(b, js, engine.ReconcilerConfig{Stream: cfg, Tracing: tp})
					})
					if sdk != nil {
						_ = sdk.Shutdown(context.Background())
					}
					b.ReportMetric(float64(n), "events")
					b.ReportMetric(float64(n)/took.Seconds(), "fold-events/s")
					b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "fold-cpu-ns/event")
					b.ReportMetric(float64(exp.spans.Load()), "spans")
					b.ReportMetric(float64(exp.recovers.Load()), "recover-spans")
					b.ReportMetric(float64(exp.publishes.Load()), "publish-spans")
				}
			})
		}
	}
}
