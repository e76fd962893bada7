package node

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// benchFill measures one fill's round trip as a provisioner sees it:
// request → judge → (write, fsync, rename, fsync dir) → filled or refusal
// appended and acknowledged → reply.
func benchFill(b *testing.B, account, writer string) {
	_, nc, js, _, cfg := storetest.StartStream(b, store.StreamConfig{})
	dir := b.TempDir()
	rt, err := NewDirRuntime(filepath.Join(dir, "modules"))
	if err != nil {
		b.Fatal(err)
	}
	if err := mkdir(filepath.Join(dir, "root")); err != nil {
		b.Fatal(err)
	}
	pub := store.NewPublisher(js, cfg.Subjects())
	plan := events.Stamp(&events.Plan{Cause: 1, Want: 1, ProvisionerAccount: account, Modules: []events.PlanModule{
		{Name: mbg, Build: "g:1", RunsAs: "mbg", Files: []events.File{{Path: creds, Mode: "0600"}}}}}, time.Now())
	if _, err := pub.Append(context.Background(), "ace", plan); err != nil {
		b.Fatal(err)
	}
	a, err := New(nc, js, Config{Name: "ace", Root: filepath.Join(dir, "root"), StateDir: filepath.Join(dir, "state"),
		Runtime: rt, Stream: cfg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()

	msg := nats.NewMsg(cfg.Subjects().Fill("ace"))
	msg.Header.Set(events.HeaderModule, mbg)
	msg.Header.Set(events.HeaderPath, creds)
	msg.Header.Set(events.HeaderWriter, writer)
	msg.Data = []byte(secret)
	for { // until the agent serves
		if _, err := nc.RequestMsg(msg, 5*time.Second); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.ResetTimer()
	for b.Loop() {
		resp, err := nc.RequestMsg(msg, 5*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		var r events.FillReply
		if err := json.Unmarshal(resp.Data, &r); err != nil || r.OK != (writer == account) {
			b.Fatalf("reply %s: %v", resp.Data, err)
		}
	}
}

// BenchmarkFillAccepted: an accepted write, durable on disk, reported.
func BenchmarkFillAccepted(b *testing.B) { benchFill(b, "prov", "prov") }

// BenchmarkFillRefused: a refusal (wrong account), reported. Each repeat
// has the same message id, so the stream drops it as a duplicate.
func BenchmarkFillRefused(b *testing.B) { benchFill(b, "prov", "intruder") }
