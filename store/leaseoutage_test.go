package store_test

import (
	"context"
	"errors"
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
	t.Parallel()
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

// A lease that expired while its renewals went unanswered and was
// claimed again says so at INFO when its key was gone for less than a
// TTL (a NATS election outlasting a 5 s node lease: no other holder can
// have taken it and let it go meanwhile), and at WARN when it was gone
// for a TTL or longer (another holder could have held it). A fresh
// user's finding m3: every agent warned at each kill of the lease
// bucket's leader, with nothing to act on.
func TestLeaseReclaimSaidAsTheGapWarrants(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		goneFor  int64 // failed renewals (TTL/4 apart) after the key is seen gone
		level    slog.Level
		contains string
	}{
		{"gone less than a TTL", 0, slog.LevelInfo, "no other holder took it meanwhile"},
		{"gone longer than a TTL", 6, slog.LevelWarn, "another holder could have held it meanwhile"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t)
			kv := &unreachable{KeyValue: leaseBucket(t)}
			lines := make(chan slog.Record, 1000)
			const ttl = 2 * time.Second
			l, err := store.AcquireLeaseTTL(ctx, kv, ttl, "ace", store.NewHolder("node", "ace"), slog.New(lineHandler{lines}))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(context.WithoutCancel(ctx))
			kv.down.Store(true)
			for {
				if _, err := kv.KeyValue.Get(ctx, "ace"); err != nil {
					if !errors.Is(err, jetstream.ErrKeyNotFound) {
						t.Fatal(err)
					}
					break
				}
				select {
				case <-ctx.Done():
					t.Fatal("the key never expired")
				case <-time.After(10 * time.Millisecond): // the poll's pace
				}
			}
			for seen := kv.failed.Load(); kv.failed.Load() < seen+c.goneFor; {
				select {
				case <-ctx.Done():
					t.Fatal("the renewals stopped")
				case <-time.After(10 * time.Millisecond): // the poll's pace
				}
			}
			kv.down.Store(false)
			select {
			case <-l.Reclaimed():
			case <-ctx.Done():
				t.Fatal("the lease was not claimed again")
			}
			for {
				var r slog.Record
				select {
				case r = <-lines:
				default:
					t.Fatal("no line said the lease was claimed again")
				}
				if !strings.Contains(r.Message, "claimed again") {
					continue
				}
				if r.Level != c.level || !strings.Contains(r.Message, c.contains) {
					t.Errorf("the re-claim said: %s %q; want %s with %q", r.Level, r.Message, c.level, c.contains)
				}
				return
			}
		})
	}
}
