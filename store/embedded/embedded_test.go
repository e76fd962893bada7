package embedded_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
	"github.com/meshfold/meshfold/store/embedded"
	"github.com/meshfold/meshfold/store/storetest"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// An embedded server restarted on the same data dir still holds every
// acknowledged message, and its stream.
func TestEmbeddedRestartKeepsAckedMessages(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

	start := func() (*embedded.Server, *nats.Conn, jetstream.JetStream) {
		t.Helper()
		e, err := embedded.Start(embedded.Config{DataDir: dir, Listen: "127.0.0.1:0", Logger: logger})
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
		ack, err := pub.Append(ctx, "ace", events.Stamp(&events.Journal{Level: events.LevelInfo, Msg: "note " + string(rune('a'+i)), Cause: 1}, t0))
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
	if _, err := embedded.Start(embedded.Config{Listen: "127.0.0.1:-1"}); err == nil {
		t.Fatal("Start without DataDir succeeded")
	}
}

func TestEmbeddedShutdownTwice(t *testing.T) {
	e, err := embedded.Start(embedded.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:-1"})
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
	if e.NATS().Running() {
		t.Error("server still running after Shutdown")
	}
}

// A second server on the same data directory is refused at once: two would
// assign the same stream sequences to different events and lose
// acknowledged writes. The directory is free again after Shutdown.
func TestEmbeddedDataDirLocked(t *testing.T) {
	dir := t.TempDir()
	first, err := embedded.Start(embedded.Config{DataDir: dir, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = embedded.Start(embedded.Config{DataDir: dir, Listen: "127.0.0.1:0"})
	if !errors.Is(err, embedded.ErrDataDirInUse) {
		first.Shutdown()
		t.Fatalf("second server on %s: %v, want ErrDataDirInUse", dir, err)
	}
	// The operator reads the reason once and the directory once, with
	// the holder's pid and URL (no lsof to find it).
	want := fmt.Sprintf("embedded: the data directory is in use by another meshfold server: %s (pid %d, serving %s)",
		dir, os.Getpid(), first.ClientURL())
	if err.Error() != want {
		t.Errorf("second server's error:\n got %q\nwant %q", err, want)
	}
	if err := embedded.Check(embedded.Config{DataDir: dir, Listen: "127.0.0.1:0"}); err == nil || err.Error() != want {
		t.Errorf("Check of the held directory:\n got %v\nwant %q", err, want)
	}
	first.Shutdown()
	again, err := embedded.Start(embedded.Config{DataDir: dir, Listen: "127.0.0.1:0"})
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
	_, err = embedded.Start(embedded.Config{DataDir: t.TempDir(), Listen: ln.Addr().String()})
	if err == nil || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Fatalf("Start on a busy port: %v", err)
	}
}

// Check finds what would fail Start (a busy port, a data directory
// another server holds, TLS files that do not load) without creating the
// data directory or its LOCK, and passes a directory that is free, and
// one whose server has shut down.
func TestCheckWritesNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fresh := filepath.Join(t.TempDir(), "data")
	if err := embedded.Check(embedded.Config{DataDir: fresh, Listen: ln.Addr().String()}); err == nil || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Errorf("Check of a busy port: %v", err)
	}
	if err := embedded.Check(embedded.Config{DataDir: fresh, Listen: "127.0.0.1:0", TLSCert: "/nonexistent", TLSKey: "/nonexistent"}); err == nil {
		t.Error("Check of TLS files that do not exist: nil")
	}
	if err := embedded.Check(embedded.Config{DataDir: fresh, Listen: "127.0.0.1:0"}); err != nil {
		t.Errorf("Check of a free start: %v", err)
	}
	if _, err := os.Stat(fresh); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Check created the data directory: %v", err)
	}
	dir := t.TempDir()
	first, err := embedded.Start(embedded.Config{DataDir: dir, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := embedded.Check(embedded.Config{DataDir: dir, Listen: "127.0.0.1:0"}); !errors.Is(err, embedded.ErrDataDirInUse) {
		t.Errorf("Check of a data directory in use: %v, want ErrDataDirInUse", err)
	}
	first.Shutdown()
	if err := embedded.Check(embedded.Config{DataDir: dir, Listen: "127.0.0.1:0"}); err != nil {
		t.Errorf("Check after the shutdown: %v", err)
	}
}

// An embedded server with TLS and a client CA takes clients that trust its
// CA and present a certificate, and refuses the others.
func TestEmbeddedTLS(t *testing.T) {
	f := storetest.TLS(t)
	e, err := embedded.Start(embedded.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:-1",
		TLSCert: f.ServerCert, TLSKey: f.ServerKey, TLSClientCA: f.CA})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown()
	if !strings.HasPrefix(e.ClientURL(), "tls://127.0.0.1:") {
		t.Errorf("ClientURL = %q, want tls://", e.ClientURL())
	}
	nc, err := store.Connect(store.ConnectConfig{URLs: []string{e.ClientURL()}, TLSCA: f.CA, TLSCert: f.ClientCert, TLSKey: f.ClientKey})
	if err != nil {
		t.Fatalf("client with a certificate: %v", err)
	}
	if !nc.TLSRequired() {
		t.Error("connected without TLS")
	}
	nc.Close()
	for name, cfg := range map[string]store.ConnectConfig{
		"no client certificate": {TLSCA: f.CA},
		"server not trusted":    {TLSCert: f.ClientCert, TLSKey: f.ClientKey},
	} {
		cfg.URLs = []string{e.ClientURL()}
		if nc, err := store.Connect(cfg); err == nil {
			nc.Close()
			t.Errorf("%s: connected", name)
		}
	}
	// In-process connections need no TLS.
	nc, err = e.Connect()
	if err != nil {
		t.Fatalf("in-process: %v", err)
	}
	nc.Close()

	if _, err := embedded.Start(embedded.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:-1", TLSCert: f.ServerCert}); err == nil {
		t.Error("a certificate without its key was accepted")
	}
}

// A client of a server with auth that is slow to send its CONNECT (3 s:
// a CLI under -race on a loaded 2-core machine) is still let in to
// authenticate: the server's own 2 s default cut it off, and the CLI's
// connect failed with "write: broken pipe". Here the server says nothing
// for 3 s after its INFO, and then judges the CONNECT (no creds: an
// authorization violation) instead of having timed the client out.
func TestSlowClientStillAuthenticates(t *testing.T) {
	d, err := auth.Init(t.TempDir(), auth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sa, err := d.ServerAuth()
	if err != nil {
		t.Fatal(err)
	}
	e, err := embedded.Start(embedded.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:-1", Auth: sa})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown()
	c, err := net.Dial("tcp", strings.TrimPrefix(e.ClientURL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if info, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(info, "INFO ") {
		t.Fatalf("the server's first line: %q, %v", info, err)
	}
	if err := c.SetReadDeadline(time.Now().Add(3 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the server said %q (%v) to a client that had not sent its CONNECT for 3 s, want nothing yet", line, err)
	}
	if _, err := c.Write([]byte("CONNECT {\"verbose\":false,\"protocol\":1}\r\nPING\r\n")); err != nil {
		t.Fatalf("CONNECT after 3 s: %v", err)
	}
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); err != nil || !strings.Contains(line, "Authorization Violation") {
		t.Fatalf("the answer to a CONNECT without creds: %q, %v; want its authorization violation", line, err)
	}
}

// An in-process connect waits for the server's answers as long as a TCP
// one (store.Connect, 5 s), not nats.go's default 2 s: under load, 2 s
// ended in-process connects with "read pipe: i/o timeout".
func TestInProcessConnectTimeout(t *testing.T) {
	e, err := embedded.Start(embedded.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown()
	nc, err := e.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if nc.Opts.Timeout < 5*time.Second {
		t.Errorf("in-process connect timeout %s, want 5 s as store.Connect's", nc.Opts.Timeout)
	}
	nc2, err := e.Connect(nats.Timeout(7 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	if nc2.Opts.Timeout != 7*time.Second {
		t.Errorf("nats.Timeout given to Connect: %s, want it to win", nc2.Opts.Timeout)
	}
}
