package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node"
	"github.com/meshfold/meshfold/store"
)

func TestParseSince(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 22, 0, 0, 0, time.UTC)
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"10m", "2026-12-01T21:50:00Z"},
		{"2026-12-01T23:00:00+01:00", "2026-12-01T22:00:00Z"},
	} {
		if got, err := parseSince(tc.in, now); err != nil || got != tc.want {
			t.Errorf("parseSince(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"-5m", "yesterday", "2026-12-01"} {
		if _, err := parseSince(bad, now); err == nil {
			t.Errorf("parseSince(%q): no error", bad)
		}
	}
}

// TestLogsFollowAgentStops: an agent that never answered is said in
// words, exit 1 as the exit code table says of no agent answering, never
// a bare "context deadline exceeded". One that stops answering while
// logs --follow waits (restarting: an upgrade, a restart) is waited for,
// as tail -F waits for a file, saying so on stderr (a fresh user's
// finding U24: it ended every operator's follow); the follow goes on
// from its cursor when the agent is back, and ends when the node is
// retired. Every wait is on an event, with a deadline (this test once
// had a 200 ms timeout that failed under load).
func TestLogsFollowAgentStops(t *testing.T) {
	t.Parallel()
	c := newVerbCLI(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	agent, err := nats.Connect(c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	subject := node.LogsSubject(c.cfg.Prefix, "ace")
	reply := func(m *nats.Msg, line, cursor string) {
		data, _ := json.Marshal(node.LogsReply{LogPage: node.LogPage{Lines: []string{line}, Cursor: cursor}})
		if err := m.Respond(data); err != nil {
			t.Error(err)
		}
	}

	// An agent that takes the first request and never answers.
	silent, err := agent.Subscribe(subject, func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.Flush(); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := c.run(t, "", "logs", "ace", "web", "--timeout", "200ms")
	if code != exitError || !strings.Contains(stderr, "no agent of node ace answered within 200ms") || strings.Contains(stderr, "context deadline exceeded") {
		t.Errorf("logs of an agent that never answers: exit %d, stderr %q", code, stderr)
	}
	if err := silent.Unsubscribe(); err != nil {
		t.Fatal(err)
	}

	// The first agent answers the first request and is gone before the
	// follow's next one: it unsubscribes before it replies.
	var first *nats.Subscription
	first, err = agent.Subscribe(subject, func(m *nats.Msg) {
		_ = first.Unsubscribe()
		_ = agent.Flush()
		reply(m, "hello", "c1")
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.Flush(); err != nil {
		t.Fatal(err)
	}
	out, errb := newNotifyBuffer(), newNotifyBuffer()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"logs", "ace", "web", "--follow", "-s", c.url, "--log-level", "warn"}, nil, out, errb)
	}()
	errb.waitFor(t, ctx, "meshfold: the agent of node ace stopped answering: agent restarting? waiting for it (Ctrl-C ends)\n")

	// The agent returns: the follow goes on after its cursor.
	cursors := make(chan string, 10)
	second, err := agent.Subscribe(subject, func(m *nats.Msg) {
		var q node.LogsRequest
		_ = json.Unmarshal(m.Data, &q)
		cursors <- q.Cursor
		if q.Cursor == "c1" {
			reply(m, "again", "c2")
		} // later requests wait, as a follow's do
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.Flush(); err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, ctx, "hello\nagain\n")
	errb.waitFor(t, ctx, "meshfold: the agent of node ace answers again; following\n")
	select {
	case cur := <-cursors:
		if cur != "c1" {
			t.Errorf("the follow asked the returned agent from cursor %q, want c1", cur)
		}
	case <-ctx.Done():
		t.Fatal("no request reached the returned agent")
	}

	// The node is retired and its agent stops: the follow ends, exit 0.
	pub := store.NewPublisher(c.js, c.cfg.Subjects())
	if _, err := pub.Append(ctx, "ace", events.Stamp(&events.Retire{By: "ops"}, time.Now())); err != nil {
		t.Fatal(err)
	}
	if err := second.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := agent.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != exitOK || out.String() != "hello\nagain\n" || !strings.Contains(errb.String(), "meshfold: node ace was retired (#") ||
			strings.Contains(errb.String(), "context deadline exceeded") {
			t.Errorf("logs --follow of a retired node: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
		}
	case <-ctx.Done():
		t.Fatalf("the follow did not end after the node's retirement:\n%s", errb.String())
	}
}

// notifyBuffer is a buffer safe for concurrent use whose writes a test
// waits for.
type notifyBuffer struct {
	mu    sync.Mutex
	b     bytes.Buffer
	wrote chan struct{}
}

func newNotifyBuffer() *notifyBuffer { return &notifyBuffer{wrote: make(chan struct{}, 1)} }

func (b *notifyBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case b.wrote <- struct{}{}:
	default:
	}
	return b.b.Write(p)
}

func (b *notifyBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// waitFor waits until the buffer holds s, or ctx ends.
func (b *notifyBuffer) waitFor(t *testing.T, ctx context.Context, s string) {
	t.Helper()
	for !strings.Contains(b.String(), s) {
		select {
		case <-b.wrote:
		case <-ctx.Done():
			t.Fatalf("no %q in:\n%s", s, b.String())
		}
	}
}
