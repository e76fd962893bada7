package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshfold/meshfold/internal/tracing"
	"github.com/meshfold/meshfold/internal/waitfor"
)

// Incident 1 as one trace (issue 28): every component traces into an
// in-process recorder, and the want that declares the credential is the
// root of one trace holding the reconciler's folds and publishes, the
// node's apply, module start, refusal and settle, the knock, the
// provisioner's fills and the filled that pays the knock. Each span's
// parent is the span that published what it handles, and the spans name
// the stream sequences that link them.
func TestIncident1Trace(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	m := newMeshSet(t, func(m *mesh) { m.tp = tp })
	n, p1, p2 := incident1(t, m, nil)
	healed(t, m, n, p1, p2)
	knock := must(m.events(m.ctx(), "ace", "knock"))(t)[0].Seq

	// The root: the want whose plan is p2.
	var root sdktrace.ReadOnlySpan
	// The trace is complete once the reconciler has folded the filled
	// that pays the knock and the provisioner has acted on the knock;
	// spans end as their work does, so wait for both.
	var spans []sdktrace.ReadOnlySpan
	waitfor.Until(t, deadline, "the fold of the filled in the want's trace", func() bool {
		root = nil
		for _, s := range rec.Ended() {
			if s.Name() == "publish want" && !s.Parent().IsValid() && seqOf(s, tracing.Seq) > p1 {
				root = s
			}
		}
		if root == nil {
			return false
		}
		spans = spans[:0]
		for _, s := range rec.Ended() {
			if s.SpanContext().TraceID() == root.SpanContext().TraceID() {
				spans = append(spans, s)
			}
		}
		return under(spans, "fold filled", "publish filled") && under(spans, "fill pass", "publish knock")
	})
	slices.SortFunc(spans, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	t.Logf("incident 1 as one trace (%s), %d spans:\n%s", root.SpanContext().TraceID(), len(spans), tree(spans, root))

	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byID[s.SpanContext().SpanID()] = s
	}
	parentOf := func(s sdktrace.ReadOnlySpan) string {
		if p, ok := byID[s.Parent().SpanID()]; ok {
			return p.Name()
		}
		return ""
	}
	// Each step: a span of this name whose parent is that, and whose
	// attribute names the sequence it handles.
	find := func(name, parent string, key attribute.Key, seq uint64) sdktrace.ReadOnlySpan {
		t.Helper()
		for _, s := range spans {
			if s.Name() == name && parentOf(s) == parent && (key == "" || seqOf(s, key) == seq) {
				return s
			}
		}
		t.Errorf("no span %q (%s %d) under %q in the trace", name, key, seq, parent)
		return nil
	}
	w2 := seqOf(root, tracing.Seq)
	find("fold want", "publish want", tracing.Seq, w2)
	find("publish plan", "fold want", tracing.Cause, w2)
	find("publish plan", "fold want", tracing.Seq, p2)
	apply := find("apply plan", "publish plan", tracing.Seq, p2)
	find("start module", "apply plan", "", 0)
	// The eager provisioner's fill, judged by p1 and refused.
	find("fill pass", "publish plan", tracing.Plan, p2)
	refused := find("fill", "fill pass", "", 0)
	if refused != nil && attr(refused, tracing.Reason) != "undeclared" {
		t.Errorf("the first fill's reason is %q, want undeclared", attr(refused, tracing.Reason))
	}
	refusal := find("publish refusal", "fill", tracing.Plan, p1)
	if refusal != nil {
		find("fold refusal", "publish refusal", tracing.Seq, seqOf(refusal, tracing.Seq))
	}
	settle := find("publish settle", "apply plan", tracing.Plan, p2)
	if settle != nil {
		find("fold settle", "publish settle", tracing.Seq, seqOf(settle, tracing.Seq))
		find("publish knock", "fold settle", tracing.Cause, seqOf(settle, tracing.Seq))
	}
	find("publish knock", "fold settle", tracing.Seq, knock)
	filled := find("publish filled", "fill", tracing.Plan, p2)
	if filled != nil {
		find("fold filled", "publish filled", tracing.Seq, seqOf(filled, tracing.Seq))
		// The accepting fill is the provisioner's, on the settle or on the
		// knock (whichever came first; the other finds it unchanged).
		fill := byID[filled.Parent().SpanID()]
		if pass := parentOf(fill); pass != "fill pass" && pass != "fill declared" {
			t.Errorf("the accepting fill's parent is %q, want the provisioner's fill", pass)
		}
	}
	// The knock is acted on: a fill pass under it, linked to the plan.
	if pass := find("fill pass", "publish knock", tracing.Plan, p2); pass != nil && len(pass.Links()) != 1 {
		t.Errorf("the knock's fill pass has %d links, want 1 (the plan)", len(pass.Links()))
	}
	if apply != nil && apply.EndTime().Before(apply.StartTime()) {
		t.Errorf("apply span ends before it starts")
	}
}

func seqOf(s sdktrace.ReadOnlySpan, k attribute.Key) uint64 {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return uint64(kv.Value.AsInt64())
		}
	}
	return 0
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) string {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value.Emit()
		}
	}
	return ""
}

// under reports whether spans hold one named name whose parent, among
// spans, is named parent.
func under(spans []sdktrace.ReadOnlySpan, name, parent string) bool {
	return slices.ContainsFunc(spans, func(s sdktrace.ReadOnlySpan) bool {
		return s.Name() == name && slices.ContainsFunc(spans, func(p sdktrace.ReadOnlySpan) bool {
			return p.Name() == parent && p.SpanContext().SpanID() == s.Parent().SpanID()
		})
	})
}

// tree prints spans as an indented tree under root, each with its
// duration, its offset from the root's start and the sequences it names.
func tree(spans []sdktrace.ReadOnlySpan, root sdktrace.ReadOnlySpan) string {
	kids := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		kids[s.Parent().SpanID()] = append(kids[s.Parent().SpanID()], s)
	}
	var b strings.Builder
	var walk func(s sdktrace.ReadOnlySpan, depth int)
	walk = func(s sdktrace.ReadOnlySpan, depth int) {
		var seqs []string
		for _, k := range []attribute.Key{tracing.Seq, tracing.Cause, tracing.Plan} {
			if v := seqOf(s, k); v != 0 {
				seqs = append(seqs, fmt.Sprintf("%s=%d", strings.TrimPrefix(string(k), "meshfold."), v))
			}
		}
		for _, k := range []attribute.Key{tracing.Module, tracing.Reason} {
			if v := attr(s, k); v != "" {
				seqs = append(seqs, strings.TrimPrefix(string(k), "meshfold.")+"="+v)
			}
		}
		links := ""
		if n := len(s.Links()); n > 0 {
			links = fmt.Sprintf(" links=%d", n)
		}
		fmt.Fprintf(&b, "  %-9s +%-9s %s%-16s %s%s\n", s.EndTime().Sub(s.StartTime()).Round(time.Microsecond),
			s.StartTime().Sub(root.StartTime()).Round(time.Microsecond), strings.Repeat("  ", depth), s.Name(), strings.Join(seqs, " "), links)
		for _, k := range kids[s.SpanContext().SpanID()] {
			walk(k, depth+1)
		}
	}
	walk(root, 0)
	return b.String()
}
