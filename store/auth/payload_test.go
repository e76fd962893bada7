package auth_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/store/auth"
)

// TestNodePayloadBound is fresh10's M6: a node credential's messages are
// bounded by the server, not only by the stream. The server tells
// node-ace's connection its user's limit (auth.NodeMaxPayload, from the
// JWT; a client that ignores it is disconnected with "maximum payload
// violation"), a message of the bound is taken, and one byte more is
// refused. The reconciler, whose snapshots are larger, keeps the
// server's default.
func TestNodePayloadBound(t *testing.T) {
	t.Parallel()
	s := startSecured(t)
	nc, _ := s.mustConnect(t, "node-ace")
	// The server's INFO with the user's limit follows the CONNECT: wait
	// for it (a round trip) before reading it.
	deadline := time.Now().Add(20 * time.Second)
	for nc.MaxPayload() != auth.NodeMaxPayload {
		if time.Now().After(deadline) {
			t.Fatalf("node-ace's max payload is %d, want %d", nc.MaxPayload(), auth.NodeMaxPayload)
		}
		if err := nc.FlushTimeout(10 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// Core publishes on its own have subject: nothing stores them.
	if err := nc.Publish("mesh.ace.have", make([]byte, auth.NodeMaxPayload)); err != nil {
		t.Fatalf("a message of the bound: %v", err)
	}
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		t.Fatalf("a message of the bound: %v", err)
	}
	if err := nc.Publish("mesh.ace.have", make([]byte, auth.NodeMaxPayload+1)); !errors.Is(err, nats.ErrMaxPayload) {
		t.Fatalf("a message over the bound: %v, want %v", err, nats.ErrMaxPayload)
	}

	rc, _ := s.mustConnect(t, "reconciler")
	if err := rc.FlushTimeout(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if rc.MaxPayload() != 1<<20 {
		t.Fatalf("the reconciler's max payload is %d, want the server's default 1 MiB", rc.MaxPayload())
	}
}
