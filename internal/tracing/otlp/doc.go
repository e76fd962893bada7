// Package otlp sets up the OpenTelemetry SDK that exports meshfold's
// spans over OTLP/HTTP: off unless an endpoint is given (the command's
// --otlp-endpoint) or the standard OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, and honouring the other
// OTEL_* variables the SDK reads (headers, timeout, compression,
// sampler, batch processor, service name, resource attributes).
//
// Only the command imports it, so that the roles' libraries link the
// OpenTelemetry API and not its SDK.
package otlp
