package store_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
)

// unreachable is a bucket whose renewals time out while down is set, as
// they do while the server is away; each such Update is counted.
type unreachable struct {
	jetstream.KeyValue
	down   atomic.Bool
	failed atomic.Int64
}

func (kv *unreachable) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if kv.down.Load() {
		kv.failed.Add(1)
		return 0, context.DeadlineExceeded
	}
	return kv.KeyValue.Update(ctx, key, value, rev)
}

// lineHandler sends every record's level and message.
type lineHandler struct{ c chan slog.Record }

func (h lineHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h lineHandler) Handle(_ context.Context, r slog.Record) error {
	h.c <- r.Clone()
	return nil
}
func (h lineHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h lineHandler) WithGroup(string) slog.Handler      { return h }

// A lease whose renewals cannot reach the server says so once, with the
// holder's note, not once each renewal (a fresh user's finding U24: 13
// lines in 16 s of a NATS outage), and once when they reach it again;
// the renewals between are at the debug level.
func TestLeaseOutageSaidOnce(t *testing.T) {
	ctx := testCtx(t)
	kv := &unreachable{KeyValue: leaseBucket(t)}
	lines := make(chan slog.Record, 1000)
	l, err := store.AcquireLeaseTTL(ctx, kv, 400*time.Millisecond, "ace", store.NewHolder("node", "ace"), slog.New(lineHandler{lines}))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.WithoutCancel(ctx))
	l.SetOutageNote("the modules keep running")
	next := func() slog.Record {
		t.Helper()
		select {
		case r := <-lines:
			return r
		case <-ctx.Done():
			t.Fatal("no log line")
		}
		return slog.Record{}
	}
	kv.down.Store(true)
	r := next()
	if r.Level != slog.LevelWarn || !strings.HasPrefix(r.Message, "NATS unreachable since ") ||
		!strings.Contains(r.Message, "; the modules keep running (lease not renewed; retrying every 100ms") {
		t.Fatalf("first failed renewal: %s %q", r.Level, r.Message)
	}
	// Five more failed renewals, each at the debug level only.
	for kv.failed.Load() < 6 {
		if r := next(); r.Level != slog.LevelDebug {
			t.Errorf("renewal %d during the outage: %s %q", kv.failed.Load(), r.Level, r.Message)
		}
	}
	kv.down.Store(false)
	for {
		r := next()
		if r.Level == slog.LevelDebug {
			continue // a failure that raced the return
		}
		if r.Level != slog.LevelInfo || !strings.HasPrefix(r.Message, "NATS reachable again, after ") {
			t.Errorf("the return: %s %q", r.Level, r.Message)
		}
		break
	}
	select {
	case <-l.Lost():
		t.Fatalf("lease lost: %v", l.Err())
	default:
	}
}
