package e2e

import (
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/meshfold/meshfold/internal/tracing"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/rollout"
)

// A rollout's wants are folded under spans too: each target's want the
// rollout controller publishes has its `fold want`, and the plan it
// causes its `publish plan` under it (a fresh user's finding F11: with
// --otlp-endpoint, only the CLI's wants had them).
func TestRolloutWantsTraced(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	m := newMeshSet(t, func(m *mesh) { m.tp = tp })
	nodes := fleetNodes(t, m, 2)
	f := fleetFile(t, nodes, "web:2", "{batch: 2, max_unavailable: 2, min_healthy: 1s, healthy_deadline: 30s}")
	id := m.apply(t, f)
	if s := m.waitRollout(t, "web", id, ""); s.Rollout.Phase != rollout.Completed {
		t.Fatalf("phase %s", s.Rollout.Phase)
	}
	for _, n := range nodes {
		var want uint64
		for _, ev := range must(m.events(m.ctx(), n.name, "want"))(t) {
			if ev.Seq > id {
				want = ev.Seq
			}
		}
		if want == 0 {
			t.Fatalf("%s: no want after the rollout's start #%d", n.name, id)
		}
		waitfor.Until(t, deadline, "the fold of "+n.name+"'s rollout want, with its plan's publish under it", func() bool {
			var fold sdktrace.ReadOnlySpan
			for _, s := range rec.Ended() {
				if s.Name() == "fold want" && seqOf(s, tracing.Seq) == want {
					fold = s
				}
			}
			if fold == nil {
				return false
			}
			for _, s := range rec.Ended() {
				if s.Name() == "publish plan" && s.Parent().SpanID() == fold.SpanContext().SpanID() && seqOf(s, tracing.Cause) == want {
					return true
				}
			}
			return false
		})
	}
}
