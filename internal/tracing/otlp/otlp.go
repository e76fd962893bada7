package otlp

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// ErrEndpoint: the endpoint is not an http or https URL.
var ErrEndpoint = errors.New("otlp: the endpoint must be an http:// or https:// URL")

// Config says where spans go and who sends them.
type Config struct {
	// Endpoint is the collector's base URL (http://host:4318), as
	// OTEL_EXPORTER_OTLP_ENDPOINT is: spans are posted to its path
	// followed by /v1/traces. It overrides the environment. Empty: the
	// environment decides, and with neither variable set tracing is off.
	Endpoint string
	// Service is service.name when OTEL_SERVICE_NAME is not set
	// ("meshfold-serve", "meshfold-node", …).
	Service string
	// Getenv reads the environment; nil: os.Getenv.
	Getenv func(string) string
}

// Enabled reports whether cfg turns tracing on: an endpoint, or one of
// the OTLP endpoint variables, and neither OTEL_SDK_DISABLED=true nor
// OTEL_TRACES_EXPORTER=none.
func (cfg Config) Enabled() bool {
	env := cfg.getenv()
	if strings.EqualFold(env("OTEL_SDK_DISABLED"), "true") || strings.EqualFold(env("OTEL_TRACES_EXPORTER"), "none") {
		return false
	}
	return cfg.Endpoint != "" || env("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

func (cfg Config) getenv() func(string) string {
	if cfg.Getenv != nil {
		return cfg.Getenv
	}
	return os.Getenv
}

// Provider is a running tracer provider: its spans are batched and
// exported until Shutdown.
type Provider struct {
	sdk *sdktrace.TracerProvider
}

// TracerProvider returns the provider to hand the roles, nil when p is
// nil (tracing off): a role given nil traces nothing.
func (p *Provider) TracerProvider() trace.TracerProvider {
	if p == nil {
		return nil
	}
	return p.sdk
}

// Shutdown exports the spans still batched and stops; nil p does
// nothing. ctx bounds the wait for the collector.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	return p.sdk.Shutdown(ctx)
}

// Start returns the provider cfg asks for, or nil (and no error) when
// tracing is off (see [Config.Enabled]). Nothing is sent before the
// first span ends; an unreachable collector only loses spans (the SDK
// logs the failed export), it never stops the command.
//
// Errors: [ErrEndpoint] for an Endpoint that is not an http(s) URL; the
// exporter's for a malformed environment.
func Start(ctx context.Context, cfg Config) (*Provider, error) {
	if !cfg.Enabled() {
		return nil, nil
	}
	var opts []otlptracehttp.Option
	if cfg.Endpoint != "" {
		u, err := url.Parse(cfg.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%w: %q", ErrEndpoint, cfg.Endpoint)
		}
		u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
		opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("otlp: exporter: %w", err)
	}
	// The service name given here, then OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES over it (a later detector wins).
	res, err := resource.New(ctx, resource.WithTelemetrySDK(), resource.WithHost(),
		resource.WithAttributes(semconv.ServiceName(cfg.Service)), resource.WithFromEnv())
	if err != nil && res == nil {
		return nil, fmt.Errorf("otlp: resource: %w", err)
	}
	return &Provider{sdk: sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))}, nil
}
