package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/embedded"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Start starts an embedded server on a random loopback port with its data
// in t.TempDir(), connects to it in-process and returns the server, the
// connection and a JetStream context. Cleanup closes the connection and
// shuts the server down. It fails the test on any error.
func Start(t testing.TB) (*embedded.Server, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	e, err := embedded.Start(embedded.Config{
		DataDir: t.TempDir(),
		Listen:  "127.0.0.1:-1",
	})
	if err != nil {
		t.Fatalf("storetest: start embedded nats: %v", err)
	}
	t.Cleanup(e.Shutdown)
	nc, err := e.Connect()
	if err != nil {
		t.Fatalf("storetest: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("storetest: jetstream: %v", err)
	}
	return e, nc, js
}

// StartStream is [Start] plus [store.EnsureStream] with cfg. It returns
// the stream and its effective configuration (every field set) as well.
func StartStream(t testing.TB, cfg store.StreamConfig) (*embedded.Server, *nats.Conn, jetstream.JetStream, jetstream.Stream, store.StreamConfig) {
	t.Helper()
	e, nc, js := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, eff, err := store.EnsureStream(ctx, js, cfg)
	if err != nil {
		t.Fatalf("storetest: ensure stream: %v", err)
	}
	return e, nc, js, stream, eff
}
