package enginetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
	return RawDecodeStdFirst(tb, js, cfg, want, nil)
}

// RawDecodeStdFirst is [RawDecodeStd] that also sets *first (when not
// nil) to the time from the read's start to its first message: the
// read's fixed cost (its consumers created, the first fetch answered).
func RawDecodeStdFirst(tb testing.TB, js jetstream.JetStream, cfg store.StreamConfig, want int, first *time.Duration) time.Duration {
	subj := cfg.Subjects()
	return rawReadFirst(tb, js, cfg, want, first, func(_ int, m jetstream.Msg) error {
		if _, err := m.Metadata(); err != nil {
			return err
		}
		return decodeStd(subj, m)
	})
}

func rawRead(tb testing.TB, js jetstream.JetStream, cfg store.StreamConfig, want int, each func(jetstream.Msg) error) time.Duration {
	return rawReadPart(tb, js, cfg, want, func(_ int, m jetstream.Msg) error { return each(m) })
}

// errPast, from a rawReadPart's each: the message is not one of those
// read (it lies past its partition's last), and is not counted.
var errPast = errors.New("past the partition's last message read")

// rawReadPart is rawRead whose each is told the message's partition and
// may return errPast.
func rawReadPart(tb testing.TB, js jetstream.JetStream, cfg store.StreamConfig, want int, each func(int, jetstream.Msg) error) time.Duration {
	return rawReadFirst(tb, js, cfg, want, nil, each)
}

// rawReadFirst is rawReadPart that sets *first (when not nil) to the
// time from its start to the first message of any partition.
func rawReadFirst(tb testing.TB, js jetstream.JetStream, cfg store.StreamConfig, want int, first *time.Duration, each func(int, jetstream.Msg) error) time.Duration {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	var firstAt atomic.Int64 // nanoseconds after start, +1; 0: none yet
	var got atomic.Int64
	all := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	consumers := make([]jetstream.Consumer, cfg.Partitions)
	names := make([]string, cfg.Partitions)
	for p := range cfg.Partitions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cons, err := js.OrderedConsumer(ctx, cfg.Name, jetstream.OrderedConsumerConfig{FilterSubjects: []string{cfg.Subjects().StoredPartitionAll(p)}})
			if err != nil {
				tb.Error(err)
				return
			}
			consumers[p] = cons
			it, err := cons.Messages()
			if err != nil {
				tb.Error(err)
				return
			}
			if info := cons.CachedInfo(); info != nil {
				names[p] = info.Name
			}
			go func() { <-ctx.Done(); it.Stop() }()
			for {
				m, err := it.Next()
				if err != nil {
					return
				}
				_ = m.Data()
				if first != nil && firstAt.Load() == 0 {
					firstAt.CompareAndSwap(0, int64(time.Since(start))+1)
				}
				if err := each(p, m); errors.Is(err, errPast) {
					continue
				} else if err != nil {
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
	// A consumer the client recreated mid-read (a sequence gap, or two
	// missed 5 s heartbeats: a pull left unanswered) is named anew: said,
	// since such a read's time is mostly the wait.
	var recreated []int
	for p, cons := range consumers {
		if cons == nil {
			continue
		}
		if info := cons.CachedInfo(); info != nil && info.Name != names[p] {
			recreated = append(recreated, p)
		}
	}
	if len(recreated) > 0 {
		tb.Logf("raw read of %d messages took %s: the consumers of partitions %v were recreated during it", want, took.Round(time.Millisecond), recreated)
	}
	// The client does not delete an ordered consumer on its stop: the
	// server keeps it for its inactivity threshold (5 minutes), and a
	// benchmark's raw reads of 16 consumers each reached the server's
	// 1,000 consumers a stream within that (82 pairs of two builds at
	// 1,000 nodes: every session of the next refold failed "maximum
	// consumers limit reached"). Deleted here, after the timed part.
	for _, cons := range consumers {
		if cons != nil {
			store.DropOrdered(js, cfg.Name, cons)
		}
	}
	if first != nil {
		*first = time.Duration(firstAt.Load() - 1)
	}
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
// start. It fails tb on a read error (one that timed out is read
// again), and a second before the test binary's deadline (as
// internal/waitfor does; a benchmark has none, its -timeout ends it)
// saying which partition's checkpoint it last read below which target,
// instead of hanging until the binary is killed.
func WaitCheckpoints(tb testing.TB, snaps *store.Snapshots, targets map[int]uint64, start time.Time) time.Duration {
	tb.Helper()
	var end time.Time
	if d, ok := tb.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok {
			end = dl.Add(-time.Second)
		}
	}
	for p, want := range targets {
		for {
			ck, err := snaps.Checkpoint(context.Background(), p)
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
				// One read unanswered in nats.go's 5 s (a starved
				// server: load 65 under -race) is not the checkpoint's
				// fault: read again, within the deadline below.
				ck = 0
			} else if err != nil {
				tb.Fatal(err)
			}
			if ck >= want {
				break
			}
			if !end.IsZero() && time.Now().After(end) {
				tb.Fatalf("timed out after %v waiting for partition %d's checkpoint to reach #%d; last saw #%d",
					time.Since(start).Round(time.Millisecond), p, want, ck)
			}
			time.Sleep(2 * time.Millisecond) // polled finely: benchmarks time the catch-up with it
		}
	}
	return time.Since(start)
}

// RawPipeline is the baseline of a first refold that publishes its
// effects (issue 27): as [RawDecodeStd], until want messages have
// arrived, each partition's read counting only messages up to its
// sequence in last (messages appended since, a fold's effects, are
// passed over); and, spread evenly over the read, one asynchronous
// publish of each of effects (the n-th on <prefix>.<n mod 8,192>, a
// stream of its own on the same server), each with a message id of its
// own. Every ack is awaited: each partition's reader waits for its
// pending acks 1,024 at a time and at its end. It returns the time until
// the last message was read and the last ack arrived.
func RawPipeline(tb testing.TB, js jetstream.JetStream, cfg store.StreamConfig, last map[int]uint64, want int, prefix string, effects [][]byte) time.Duration {
	subj := cfg.Subjects()
	msgs := make([]*nats.Msg, len(effects))
	for n, data := range effects {
		// Spread over 8,192 subjects, as effects over nodes' subjects.
		msgs[n] = &nats.Msg{Subject: fmt.Sprintf("%s.%d", prefix, n%8192), Data: data}
	}
	pace := newPacer(tb, js, cfg, msgs, want)
	start := time.Now()
	rawReadPart(tb, js, cfg, want, func(part int, m jetstream.Msg) error {
		meta, err := m.Metadata()
		if err != nil {
			return err
		}
		if meta.Sequence.Stream > last[part] {
			return errPast
		}
		if err := decodeStd(subj, m); err != nil {
			return err
		}
		return pace.read(part)
	})
	pace.finish()
	return time.Since(start)
}

// RawLive is the baseline of the live figure that publishes as much as
// the reconciler does (issue 27): in published as [History.Publish]
// publishes it (2,000 acks in flight) while every partition is read as
// [RawDecodeStd] reads it; as the inputs are read, effects are published
// at their pace (as [RawPipeline] publishes them: asynchronously, each
// with a message id of its own, every ack awaited) on their own plain
// subjects of the same stream, so that each partition's reader reads
// them back, as a reconciler reads back its own. Of the effects read,
// plans are decoded as inputs are; knocks and journal entries are only
// counted (the fold does not decode them). It returns the time from the
// first publish until every input and every effect was read and every
// ack arrived.
func RawLive(tb testing.TB, js jetstream.JetStream, cfg store.StreamConfig, in *History, effects []*nats.Msg) time.Duration {
	subj := cfg.Subjects()
	pace := newPacer(tb, js, cfg, effects, len(in.Msgs))
	published := make(chan error, 1)
	start := time.Now()
	go func() { _, err := in.Publish(js); published <- err }()
	rawReadPart(tb, js, cfg, len(in.Msgs)+len(effects), func(part int, m jetstream.Msg) error {
		if _, err := m.Metadata(); err != nil {
			return err
		}
		_, kind, err := subj.Parse(m.Subject())
		if err != nil {
			return err
		}
		if kind == events.KindKnock || kind == events.KindJournal {
			return nil
		}
		if err := decodeStd(subj, m); err != nil {
			return err
		}
		if kind == events.KindPlan {
			return nil
		}
		return pace.read(part)
	})
	if err := <-published; err != nil {
		tb.Fatal(err)
	}
	pace.finish()
	return time.Since(start)
}

// decodeStd decodes m's payload with encoding/json into its kind's type.
func decodeStd(subj events.Subjects, m jetstream.Msg) error {
	_, kind, err := subj.Parse(m.Subject())
	if err != nil {
		return err
	}
	p := events.New(kind)
	if p == nil {
		return fmt.Errorf("kind %q", kind)
	}
	return json.Unmarshal(m.Data(), p)
}

// pacer publishes effects asynchronously, each with a message id of its
// own, while the messages they follow are read: after the r-th of inputs
// read, the first r×len(effects)/inputs are sent. Each reader (by
// partition) waits for its pending acks 1,024 at a time; finish waits for
// the rest.
//
// It publishes through a connection of its own to the same server, as a
// pipeline's producer would, not through the readers' one: with both on
// one connection, an ordered consumer's pull went unanswered now and then
// (neither messages nor heartbeats), and its partition's read waited for
// two missed 5 s heartbeats before the client recreated the consumer: 10 s
// added to a read of ~3 s, in 9 of 48 runs of the bench's mix (0 of 30
// with the connections apart; docs/benchmarks.md, "The raw pipeline's
// 10 s stalls").
type pacer struct {
	tb          testing.TB
	nc          *nats.Conn
	pjs         jetstream.JetStream
	effects     []*nats.Msg
	inputs      int64
	runID       int64
	nread, sent atomic.Int64
	mu          sync.Mutex
	pending     map[int][]jetstream.PubAckFuture
}

func newPacer(tb testing.TB, js jetstream.JetStream, cfg store.StreamConfig, effects []*nats.Msg, inputs int) *pacer {
	nc, err := nats.Connect(js.Conn().ConnectedUrl())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	// Room for every reader's window: the default (4,000 pending) would
	// stall a publish.
	pjs, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(cfg.Partitions*1024+1))
	if err != nil {
		tb.Fatal(err)
	}
	return &pacer{tb: tb, nc: nc, pjs: pjs, effects: effects, inputs: int64(inputs), runID: time.Now().UnixNano(),
		pending: map[int][]jetstream.PubAckFuture{}}
}

func await(futs []jetstream.PubAckFuture) error {
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		}
	}
	return nil
}

// read notes one more input read by partition part's reader and sends
// the effects due.
func (pc *pacer) read(part int) error {
	r := pc.nread.Add(1)
	total := int64(len(pc.effects))
	for {
		n := pc.sent.Load()
		if n >= total || n >= r*total/pc.inputs {
			return nil
		}
		if !pc.sent.CompareAndSwap(n, n+1) {
			continue
		}
		e := pc.effects[n]
		msg := &nats.Msg{Subject: e.Subject, Data: e.Data, Header: nats.Header{}}
		f, err := pc.pjs.PublishMsgAsync(msg, jetstream.WithMsgID(fmt.Sprintf("raw-%d-%d", pc.runID, n)))
		if err != nil {
			return err
		}
		pc.mu.Lock()
		futs := append(pc.pending[part], f)
		pc.pending[part] = futs
		pc.mu.Unlock()
		if len(futs) >= 1024 {
			if err := await(futs); err != nil {
				return err
			}
			pc.mu.Lock()
			pc.pending[part] = futs[:0]
			pc.mu.Unlock()
		}
	}
}

// finish waits for every pending ack and checks every effect was sent.
func (pc *pacer) finish() {
	for _, futs := range pc.pending {
		if err := await(futs); err != nil {
			pc.tb.Fatal(err)
		}
	}
	if n := pc.sent.Load(); n != int64(len(pc.effects)) {
		pc.tb.Fatalf("raw pipeline published %d effects, want %d", n, len(pc.effects))
	}
	pc.nc.Close()
}
