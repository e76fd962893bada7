package store_test

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/store"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// An embedded server restarted on the same data dir still holds every
// acknowledged message, and its stream.
func TestEmbeddedRestartKeepsAckedMessages(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

	start := func() (*store.Embedded, *nats.Conn, jetstream.JetStream) {
		t.Helper()
		e, err := store.StartEmbedded(store.EmbeddedConfig{DataDir: dir, Listen: "127.0.0.1:0", Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		nc, err := e.Connect()
		if err != nil {
			e.Shutdown()
			t.Fatal(err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return e, nc, js
	}

	e, nc, js := start()
	if u := e.ClientURL(); !strings.HasPrefix(u, "nats://127.0.0.1:") || strings.HasSuffix(u, ":4222") {
		t.Errorf("ClientURL = %q, want a random loopback port", u)
	}
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	pub := store.NewPublisher(js, cfg.Subjects())
	var acked []uint64
	for i := range 5 {
		ack, err := pub.Append(ctx, "ace", journal("note "+string(rune('a'+i))))
		if err != nil {
			t.Fatal(err)
		}
		acked = append(acked, ack.Seq)
	}
	nc.Close()
	e.Shutdown()

	e, nc, js = start()
	defer e.Shutdown()
	defer nc.Close()
	stream, cfg2, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg2 != cfg {
		t.Errorf("effective config after restart = %+v, want %+v", cfg2, cfg)
	}
	last, err := store.StreamLastSeq(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	if last != acked[len(acked)-1] {
		t.Errorf("last sequence after restart = %d, want %d", last, acked[len(acked)-1])
	}
	for _, seq := range acked {
		if _, err := stream.GetMsg(ctx, seq); err != nil {
			t.Errorf("message %d after restart: %v", seq, err)
		}
	}
	if !strings.Contains(logs.String(), "level=DEBUG") || !strings.Contains(logs.String(), "component=nats-server") {
		t.Errorf("server log not routed through slog; got:\n%.500s", logs.String())
	}
}

func TestStartEmbeddedNeedsDataDir(t *testing.T) {
	if _, err := store.StartEmbedded(store.EmbeddedConfig{Listen: "127.0.0.1:-1"}); err == nil {
		t.Fatal("StartEmbedded without DataDir succeeded")
	}
}

func TestEmbeddedShutdownTwice(t *testing.T) {
	e, err := store.StartEmbedded(store.EmbeddedConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:-1"})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := e.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	e.Shutdown()
	e.Shutdown()
	if e.Server().Running() {
		t.Error("server still running after Shutdown")
	}
}

// A second server on the same data directory is refused at once: two would
// assign the same stream sequences to different events and lose
// acknowledged writes. The directory is free again after Shutdown.
func TestEmbeddedDataDirLocked(t *testing.T) {
	dir := t.TempDir()
	first, err := store.StartEmbedded(store.EmbeddedConfig{DataDir: dir, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.StartEmbedded(store.EmbeddedConfig{DataDir: dir, Listen: "127.0.0.1:0"}); !errors.Is(err, store.ErrDataDirInUse) {
		first.Shutdown()
		t.Fatalf("second server on %s: %v, want ErrDataDirInUse", dir, err)
	}
	first.Shutdown()
	again, err := store.StartEmbedded(store.EmbeddedConfig{DataDir: dir, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("after shutdown: %v", err)
	}
	again.Shutdown()
}

// A busy port is an immediate error naming the address.
func TestEmbeddedBusyPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = store.StartEmbedded(store.EmbeddedConfig{DataDir: t.TempDir(), Listen: ln.Addr().String()})
	if err == nil || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Fatalf("StartEmbedded on a busy port: %v", err)
	}
}
