package main

import (
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/tracing"
)

// otlpReceiver is an OTLP/HTTP trace receiver on loopback: it keeps the
// spans posted to /v1/traces with their service's name.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []receivedSpan
}

type receivedSpan struct {
	service string
	span    *tracepb.Span
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	var in collectortrace.ExportTraceServiceRequest
	if req.URL.Path != "/v1/traces" || proto.Unmarshal(body, &in) != nil {
		http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, rs := range in.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, receivedSpan{service, s})
			}
		}
	}
	r.mu.Unlock()
	b, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(b)
}

// want --otlp-endpoint sends its publish's span to the collector before
// it exits, tells the trace's id, and the stored want carries the span
// as its traceparent; without an endpoint the want carries none.
func TestWantTraced(t *testing.T) {
	// Not parallel: t.Setenv.
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_SERVICE_NAME", "")
	recv := &otlpReceiver{}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	c := newVerbCLI(t)

	code, stdout, stderr := c.run(t, "", "want", "ace", "--new", "-f", writeWantFile(t, goodWant), "--otlp-endpoint", srv.URL)
	if code != 0 {
		t.Fatalf("want: exit %d: %s", code, stderr)
	}
	m, ok := c.last(t, "ace", events.KindWant)
	if !ok || m.Event.Seq != printedSeq(t, stdout) {
		t.Fatalf("printed %q; stored %+v", stdout, m.Event)
	}
	sc := tracing.Remote(m.Header)
	if !sc.IsValid() || !strings.Contains(stderr, "trace "+sc.TraceID().String()) {
		t.Fatalf("stored traceparent %q, stderr %q: want the trace told", m.Header.Get(tracing.Header), stderr)
	}
	recv.mu.Lock()
	spans := recv.spans
	recv.mu.Unlock()
	if len(spans) != 1 {
		t.Fatalf("received %d spans, want 1 (exported before the command exits)", len(spans))
	}
	s := spans[0]
	seq := int64(-1)
	for _, kv := range s.span.GetAttributes() {
		if kv.GetKey() == string(tracing.Seq) {
			seq = kv.GetValue().GetIntValue()
		}
	}
	if s.span.GetName() != "publish want" || s.service != "meshfold-want" || seq != int64(m.Event.Seq) ||
		hex.EncodeToString(s.span.GetTraceId()) != sc.TraceID().String() || hex.EncodeToString(s.span.GetSpanId()) != sc.SpanID().String() {
		t.Errorf("received %q of %q, seq %d, trace %x span %x; want publish want of meshfold-want, seq %d, the stored traceparent %s",
			s.span.GetName(), s.service, seq, s.span.GetTraceId(), s.span.GetSpanId(), m.Event.Seq, m.Header.Get(tracing.Header))
	}

	code, _, stderr = c.run(t, "", "want", "ace", "--new", "-f", writeWantFile(t, goodWant))
	if code != 0 {
		t.Fatalf("want: exit %d: %s", code, stderr)
	}
	if m, _ := c.last(t, "ace", events.KindWant); m.Header.Get(tracing.Header) != "" || strings.Contains(stderr, "trace ") {
		t.Errorf("untraced want: traceparent %q, stderr %q", m.Header.Get(tracing.Header), stderr)
	}
	if code, _, stderr := c.run(t, "", "want", "ace", "--new", "-f", writeWantFile(t, goodWant), "--otlp-endpoint", "127.0.0.1:4318"); code != exitUsage || !strings.Contains(stderr, "http") {
		t.Errorf("an endpoint without a scheme: exit %d, %q; want a usage error", code, stderr)
	}
}
