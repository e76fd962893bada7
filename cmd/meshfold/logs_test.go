package main

import (
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshfold/meshfold/node"
)

func TestParseSince(t *testing.T) {
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

// TestLogsFollowAgentStops: an agent that stops answering while logs
// --follow waits (killed: it took the request and never replied) is said
// in words, exit 1 as the exit code table says of no agent answering,
// never a bare "context deadline exceeded"; the same for an agent that
// never answered at all.
func TestLogsFollowAgentStops(t *testing.T) {
	c := newVerbCLI(t)
	agent, err := nats.Connect(c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	got := make(chan struct{}, 1)
	var n atomic.Int32
	if _, err := agent.Subscribe(node.LogsSubject(c.cfg.Prefix, "ace"), func(m *nats.Msg) {
		if n.Add(1) > 1 {
			got <- struct{}{} // the follow's wait: taken, never answered
			return
		}
		data, _ := json.Marshal(node.LogsReply{LogPage: node.LogPage{Lines: []string{"hello"}, Cursor: "c1"}})
		_ = m.Respond(data)
	}); err != nil {
		t.Fatal(err)
	}
	if err := agent.Flush(); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := c.run(t, "", "logs", "ace", "web", "--follow", "--timeout", "200ms")
	select {
	case <-got:
	default:
		t.Fatal("the follow's second request never reached the agent")
	}
	if code != exitError || stdout != "hello\n" || !strings.Contains(stderr, "the agent of node ace stopped answering") ||
		strings.Contains(stderr, "context deadline exceeded") {
		t.Errorf("logs --follow of an agent that stopped: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	// An agent that takes the first request and never answers.
	n.Store(1)
	code, _, stderr = c.run(t, "", "logs", "ace", "web", "--timeout", "200ms")
	if code != exitError || !strings.Contains(stderr, "no agent of node ace answered within 200ms") || strings.Contains(stderr, "context deadline exceeded") {
		t.Errorf("logs of an agent that never answers: exit %d, stderr %q", code, stderr)
	}
}
