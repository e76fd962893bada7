package enginetest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// RawConsume reads every partition of cfg's stream with one ordered
// consumer a partition, in parallel, as the reconciler does, until want
// messages have arrived (they may still be being published), and returns
// how long that took. It touches each message's data and nothing else.
func RawConsume(tb testing.TB, js jetstream.JetStream, cfg store.StreamConfig, want int) time.Duration {
	return rawRead(tb, js, cfg, want, func(jetstream.Msg) error { return nil })
}

// RawDecode is the baseline of issue 17: as [RawConsume], each message's
// metadata parsed and its payload decoded (events.DecodeEvent:
// encoding/json into the kind's type, as the fold decodes it) and nothing
// else.
func RawDecode(tb testing.TB, js jetstream.JetStream, cfg store.StreamConfig, want int) time.Duration {
	subj := cfg.Subjects()
	return rawRead(tb, js, cfg, want, func(m jetstream.Msg) error {
		meta, err := m.Metadata()
		if err != nil {
			return err
		}
		_, err = subj.DecodeEvent(m.Subject(), m.Data(), meta.Sequence.Stream, meta.Timestamp)
		return err
	})
}

// RawDecodeStd is the baseline issue 17 states: as [RawConsume], each
// message's metadata parsed, its subject split into node and kind, and
// its payload decoded by encoding/json into the kind's type (no
// validation), as a consumer written without meshfold would read the
// stream. The fold decodes with a faster decoder ([RawDecode] measures a
// read with it), so this baseline is the slower of the two.
func RawDecodeStd(tb testing.TB, js jetstream.JetStream, cfg store.StreamConfig, want int) time.Duration {
	subj := cfg.Subjects()
	return rawRead(tb, js, cfg, want, func(m jetstream.Msg) error {
		if _, err := m.Metadata(); err != nil {
			return err
		}
		_, kind, err := subj.Parse(m.Subject())
		if err != nil {
			return err
		}
		p := events.New(kind)
		if p == nil {
			return fmt.Errorf("kind %q", kind)
		}
		return json.Unmarshal(m.Data(), p)
	})
}

func rawRead(tb testing.TB, js jetstream.JetStream, cfg store.StreamConfig, want int, each func(jetstream.Msg) error) time.Duration {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	var got atomic.Int64
	all := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for p := range cfg.Partitions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cons, err := js.OrderedConsumer(ctx, cfg.Name, jetstream.OrderedConsumerConfig{FilterSubjects: []string{fmt.Sprintf("%d.%s.*.*", p, cfg.Prefix)}})
			if err != nil {
				tb.Error(err)
				return
			}
			it, err := cons.Messages()
			if err != nil {
				tb.Error(err)
				return
			}
			go func() { <-ctx.Done(); it.Stop() }()
			for {
				m, err := it.Next()
				if err != nil {
					return
				}
				_ = m.Data()
				if err := each(m); err != nil {
					tb.Error(err)
					return
				}
				if got.Add(1) == int64(want) {
					once.Do(func() { close(all) })
				}
			}
		}()
	}
	<-all
	took := time.Since(start)
	cancel()
	wg.Wait()
	return took
}

// InputTargets returns, per partition of cfg's stream, the sequence of
// its last input event (every kind the fold reads, events.InputKinds).
// Partitions without one are absent.
func InputTargets(tb testing.TB, js jetstream.JetStream, cfg store.StreamConfig) map[int]uint64 {
	tb.Helper()
	stream, err := js.Stream(context.Background(), cfg.Name)
	if err != nil {
		tb.Fatal(err)
	}
	out := map[int]uint64{}
	for p := range cfg.Partitions {
		for _, f := range cfg.Subjects().StoredPartition(p, events.InputKinds...) {
			if m, err := stream.GetLastMsgForSubject(context.Background(), f); err == nil {
				out[p] = max(out[p], m.Sequence)
			}
		}
	}
	return out
}

// WaitCheckpoints waits, polling every 2 ms, until each partition's
// checkpoint in snaps reaches its target, and returns the time since
// start. It fails tb on a read error.
func WaitCheckpoints(tb testing.TB, snaps *store.Snapshots, targets map[int]uint64, start time.Time) time.Duration {
	tb.Helper()
	for p, want := range targets {
		for {
			ck, err := snaps.Checkpoint(context.Background(), p)
			if err != nil {
				tb.Fatal(err)
			}
			if ck >= want {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	return time.Since(start)
}
