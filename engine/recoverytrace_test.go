package engine_test

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/tracing"
	"github.com/meshfold/meshfold/internal/tracing/otlp"
	"github.com/meshfold/meshfold/store"
)

// collector is an OTLP/HTTP trace receiver on loopback, as a collector
// a user points --otlp-endpoint at: it keeps the spans posted to
// /v1/traces.
type collector struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (c *collector) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	var in collectortrace.ExportTraceServiceRequest
	if req.URL.Path != "/v1/traces" || proto.Unmarshal(body, &in) != nil {
		http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	for _, rs := range in.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			c.spans = append(c.spans, ss.GetSpans()...)
		}
	}
	c.mu.Unlock()
	b, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(b)
}

func (c *collector) named(name string) []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range c.spans {
		if s.GetName() == name {
			out = append(out, s)
		}
	}
	return out
}

// intAttr is span's integer attribute k, -1 when it has none.
func intAttr(s *tracepb.Span, k string) int64 {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == k {
			return kv.GetValue().GetIntValue()
		}
	}
	return -1
}

func strAttr(s *tracepb.Span, k string) string {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == k {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// TestRecoveryTraced: a reconciler that crashed after folding a want and
// before publishing its plan, restarted with tracing on (an OTLP
// collector), exports one `recover partition` span per partition it
// refolds, with the sequences and counts of the refold, and a `publish
// plan` span for each plan the recovery publishes: the plan of the want
// that carried a traceparent continues the want's trace (its parent is
// the want's span, its link the recovery's) and the stored plan carries
// the publish span's traceparent, for the node's `apply plan`; the plan
// of a want stored while no reconciler ran, which carried none, is
// under its recovery's span. The refolded wants get no `fold` span.
func TestRecoveryTraced(t *testing.T) {
	t.Parallel()
	g := newRig(t, store.StreamConfig{})
	col := &collector{}
	srv := httptest.NewServer(col)
	defer srv.Close()
	prov, err := otlp.Start(context.Background(), otlp.Config{Endpoint: srv.URL, Service: "meshfold-serve", Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = prov.Shutdown(context.Background()) }()

	// The want's span, as `meshfold want --otlp-endpoint` publishes it.
	const traceID, wantSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	crash := engine.Faults{AfterFold: func(int, uint64) error { return errCrash }}
	rn := g.startCfg(engine.ReconcilerConfig{Faults: crash, Logger: testLogger(t)})
	ack, err := g.pub.Append(context.Background(), "ace", events.Stamp(provOnly(), at0), store.WithMsgID("traced-want"),
		store.WithTraceparent("00-"+traceID+"-"+wantSpan+"-01"))
	if err != nil {
		t.Fatal(err)
	}
	aceWant := ack.Seq
	if err := rn.wait(t); err == nil {
		t.Fatal("the reconciler did not crash at the want's fold")
	}
	// Stored while no reconciler runs: never folded before.
	bobWant := g.append("bob", provOnly())

	rn2 := g.startCfg(engine.ReconcilerConfig{Tracing: prov.TracerProvider(), Logger: testLogger(t),
		SnapshotEvery: 3, SnapshotInterval: 20 * time.Millisecond})
	acePlan, bobPlan := g.planFor("ace", aceWant), g.planFor("bob", bobWant)
	rn2.stop(t)
	if err := prov.Shutdown(context.Background()); err != nil { // exports every span ended
		t.Fatal(err)
	}

	parts := map[int]bool{events.Partition("ace", g.cfg.Partitions): true, events.Partition("bob", g.cfg.Partitions): true}
	recovers := map[int]*tracepb.Span{}
	for _, s := range col.named("recover partition") {
		p := int(intAttr(s, string(tracing.Partition)))
		if !parts[p] || recovers[p] != nil {
			t.Errorf("recover partition span of partition %d: want one for each of %v only", p, parts)
		}
		recovers[p] = s
	}
	for p := range parts {
		s := recovers[p]
		if s == nil {
			t.Fatalf("no recover partition span for partition %d", p)
		}
		if len(s.GetParentSpanId()) != 0 || s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("partition %d's recovery: parent %x, status %v; want a root, not an error", p, s.GetParentSpanId(), s.GetStatus())
		}
		from, to := intAttr(s, string(tracing.From)), intAttr(s, string(tracing.To))
		if ev := intAttr(s, string(tracing.Events)); ev < 1 || from < 1 || to < from || intAttr(s, string(tracing.Published)) < 1 || intAttr(s, string(tracing.Effects)) < 1 {
			t.Errorf("partition %d's recovery: events %d, from %d, to %d, effects %d, published %d; want its refold counted", p, ev, from, to,
				intAttr(s, string(tracing.Effects)), intAttr(s, string(tracing.Published)))
		}
	}
	aceRec := recovers[events.Partition("ace", g.cfg.Partitions)]
	if from, to := intAttr(aceRec, string(tracing.From)), intAttr(aceRec, string(tracing.To)); from > int64(aceWant) || to < int64(aceWant) {
		t.Errorf("ace's recovery refolded #%d..#%d, want #%d among them", from, to, aceWant)
	}

	publishOf := func(node string, plan uint64) *tracepb.Span {
		t.Helper()
		for _, s := range col.named("publish plan") {
			if strAttr(s, string(tracing.Node)) == node && intAttr(s, string(tracing.Seq)) == int64(plan) {
				return s
			}
		}
		t.Fatalf("no publish plan span of %s's plan #%d", node, plan)
		return nil
	}
	ace := publishOf("ace", acePlan)
	if hex.EncodeToString(ace.GetTraceId()) != traceID || hex.EncodeToString(ace.GetParentSpanId()) != wantSpan {
		t.Errorf("ace's plan: trace %x, parent %x; want the want's trace %s under its span %s", ace.GetTraceId(), ace.GetParentSpanId(), traceID, wantSpan)
	}
	if l := ace.GetLinks(); len(l) != 1 || string(l[0].GetSpanId()) != string(aceRec.GetSpanId()) {
		t.Errorf("ace's plan's links %v, want the recovery's span %x", l, aceRec.GetSpanId())
	}
	if intAttr(ace, string(tracing.Cause)) != int64(aceWant) {
		t.Errorf("ace's plan's cause %d, want #%d", intAttr(ace, string(tracing.Cause)), aceWant)
	}
	m, err := store.LastMsg(context.Background(), g.stream, g.cfg.Subjects(), "ace", events.KindPlan)
	if err != nil {
		t.Fatal(err)
	}
	if sc := tracing.Remote(m.Header); sc.SpanID().String() != hex.EncodeToString(ace.GetSpanId()) {
		t.Errorf("the stored plan's traceparent %q, want the publish span %x", m.Header.Get(tracing.Header), ace.GetSpanId())
	}
	bob := publishOf("bob", bobPlan)
	bobRec := recovers[events.Partition("bob", g.cfg.Partitions)]
	if string(bob.GetParentSpanId()) != string(bobRec.GetSpanId()) || string(bob.GetTraceId()) != string(bobRec.GetTraceId()) {
		t.Errorf("bob's plan's parent %x, want its recovery's span %x", bob.GetParentSpanId(), bobRec.GetSpanId())
	}
	if f := col.named("fold want"); len(f) != 0 {
		t.Errorf("%d fold want spans: the refold traced each event", len(f))
	}
	col.mu.Lock()
	t.Logf("spans exported by the restart: %d (%d recover partition)", len(col.spans), len(recovers))
	col.mu.Unlock()
}
