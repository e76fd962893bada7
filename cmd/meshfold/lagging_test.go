package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// On a 3-server cluster whose third replica is behind (its replication
// held: storetest.Lag), a stale --expect still names the newest want's
// sequence, the one to retry with, every time: the conflict's message
// reads it from the stream's leader. Read with a direct get, which any
// replica answers, the replica behind named the want before, a third of
// the time, and the retry it advised conflicted again.
func TestWantExpectConflictNamesTheNewestWithAReplicaBehind(t *testing.T) {
	t.Parallel()
	c, lag := storetest.StartLaggingCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	nc, err := nats.Connect(c.Servers[0].ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	held := c.Follower(cfg.Name)
	url := c.Servers[0].ClientURL()
	want := func(expect ...string) (int, string, string) {
		var out, errb bytes.Buffer
		args := append([]string{"want", "ace", "--new", "-f", writeWantFile(t, goodWant), "--allow-missing-build", "-s", url, "--log-level", "warn"}, expect...)
		code := run(ctx, args, strings.NewReader(""), &out, &errb)
		return code, out.String(), errb.String()
	}
	code, stdout, stderr := want()
	if code != 0 {
		t.Fatalf("want: exit %d: %s", code, stderr)
	}
	first := strconv.FormatUint(printedSeq(t, stdout), 10)
	c.WaitDirectGets(cfg.Name)
	lag.Hold(held.Name())
	defer lag.Release()
	code, stdout, stderr = want("--expect", first)
	if code != 0 {
		t.Fatalf("want --expect %s: exit %d: %s", first, code, stderr)
	}
	newest := strconv.FormatUint(printedSeq(t, stdout), 10)
	const tries = 30 // the replica behind answers a direct get a third of the time
	for i := range tries {
		code, _, stderr = want("--expect", first)
		if code != exitConflict || !strings.Contains(stderr, "at sequence "+newest+" ") || !strings.Contains(stderr, "retry with --expect "+newest) {
			t.Fatalf("try %d: stale --expect %s: exit %d, %q; want %d naming sequence %s", i, first, code, stderr, exitConflict, newest)
		}
	}
}
