package otlp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/meshfold/meshfold/internal/tracing"
)

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestEnabled(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		want bool
	}{
		{"nothing set", Config{Getenv: env(nil)}, false},
		{"flag", Config{Endpoint: "http://127.0.0.1:4318", Getenv: env(nil)}, true},
		{"endpoint variable", Config{Getenv: env(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})}, true},
		{"traces endpoint variable", Config{Getenv: env(map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})}, true},
		{"sdk disabled", Config{Endpoint: "http://c:4318", Getenv: env(map[string]string{"OTEL_SDK_DISABLED": "true"})}, false},
		{"exporter none", Config{Getenv: env(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"})}, false},
	} {
		if got := c.cfg.Enabled(); got != c.want {
			t.Errorf("%s: Enabled() = %v, want %v", c.name, got, c.want)
		}
	}
	p, err := Start(t.Context(), Config{Getenv: env(nil)})
	if p != nil || err != nil || p.TracerProvider() != nil || p.Shutdown(t.Context()) != nil {
		t.Errorf("off: Start = %v, %v; want nil, nil, and a nil provider that shuts down", p, err)
	}
	if _, err := Start(t.Context(), Config{Endpoint: "127.0.0.1:4318"}); !errors.Is(err, ErrEndpoint) {
		t.Errorf("an endpoint without a scheme: %v, want ErrEndpoint", err)
	}
}

// A span reaches an OTLP/HTTP receiver on loopback, posted to the
// endpoint's path followed by /v1/traces, with the service's name.
func TestExportsOverHTTP(t *testing.T) {
	got := make(chan *collectortrace.ExportTraceServiceRequest, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/prefix/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("posted to %s as %s, want /prefix/v1/traces as protobuf", r.URL.Path, r.Header.Get("Content-Type"))
		}
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			t.Errorf("not an OTLP request: %v", err)
		}
		got <- &req
		w.Header().Set("Content-Type", "application/x-protobuf")
		b, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	p, err := Start(t.Context(), Config{Endpoint: srv.URL + "/prefix/", Service: "meshfold-test", Getenv: env(nil)})
	if err != nil || p == nil {
		t.Fatalf("Start: %v, %v", p, err)
	}
	_, span := tracing.Tracer(p.TracerProvider()).Start(context.Background(), "publish want")
	span.SetAttributes(tracing.SeqAttr(tracing.Seq, 7))
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case req := <-got:
		rs := req.GetResourceSpans()
		if len(rs) != 1 || len(rs[0].GetScopeSpans()) != 1 || len(rs[0].GetScopeSpans()[0].GetSpans()) != 1 {
			t.Fatalf("received %v, want one span", req)
		}
		s := rs[0].GetScopeSpans()[0].GetSpans()[0]
		service := ""
		for _, kv := range rs[0].GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		if s.GetName() != "publish want" || service != "meshfold-test" || rs[0].GetScopeSpans()[0].GetScope().GetName() != tracing.Name {
			t.Errorf("received span %q of service %q, scope %q", s.GetName(), service, rs[0].GetScopeSpans()[0].GetScope().GetName())
		}
	case <-ctx.Done():
		t.Fatal("nothing received")
	}
}
