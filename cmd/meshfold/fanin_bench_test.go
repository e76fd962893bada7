package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine/enginetest"
	"github.com/meshfold/meshfold/store"
)

// BenchmarkReadFanIn measures what the reconciler's reading with one
// consumer a partition costs against one consumer for the process,
// demultiplexed by the client (issue 27: the dense first refold's server
// spent 48.7 % of its samples in the consumers' reads). Nothing of the
// engine runs: the stream is the dense mix's whole history
// (enginetest.SimulateDense, mixEvents over mixNodes, sealed and loaded
// as BenchmarkCatchUpMixes loads it: real stored subjects
// <p>.<prefix>.<node>.<kind> over the stream's partitions), on one server
// process, read by this process in four ways:
//
//   - per-partition: one consumer a partition, all at once, each made
//     as a partition session makes its own (store.Follow with EndOnLoss,
//     the filter <p>.<prefix>.*.*, the session's heartbeat), each drained
//     by a goroutine of its own;
//   - one-unfiltered: one consumer of the same kind without a filter,
//     its callback handing each message, its metadata parsed, to its
//     partition's goroutine by the subject's first token;
//   - one-multifilter: the same with the partitions' filters as the
//     consumer's FilterSubjects (one each);
//   - one-wildcard: the same with one filter *.<prefix>.*.*.
//
// catchup/<way>/runN reads the whole stream from its first message; the
// four ways alternate, twice. live/<way>/runN starts the consumers at the
// stream's end (per-partition with DeliverNew) and publishes
// MESHFOLD_BENCH_FANIN_LIVE (default 60,000) dense inputs at
// MESHFOLD_BENCH_FANIN_RATE a second (default 10,000), in batches every
// 10 ms, until the consumers have every one; live/none publishes with no
// consumer (the server's cost of storing them alone). Each reports its
// wall time, events/s, the server's and this process's CPU an event
// (rusage), the load average at its start, and its time against the
// per-partition run of the same round (speed-vs-per-partition: > 1
// faster, from the time an event). A read that has not ended within
// MESHFOLD_BENCH_FANIN_BUDGET seconds (default 20) is cut there, its
// figures over what it read (read-fraction < 1).
//
//	go test ./cmd/meshfold -run '^$' -bench '^BenchmarkReadFanIn$' -benchtime 1x -timeout 20m
func BenchmarkReadFanIn(b *testing.B) {
	if testing.Short() {
		b.Skip("-short")
	}
	s := startOutsideServer(b)
	defer s.srv.Stop()
	s.load(b, enginetest.SimulateDense(mixEvents, mixNodes))
	want := s.msgs
	b.Logf("stream: %d messages over %d partitions, load %s", want, s.cfg.Partitions, loadAvg())
	ways := []string{"per-partition", "one-unfiltered", "one-multifilter", "one-wildcard"}
	for run := 1; run <= 2; run++ {
		var base time.Duration
		for _, way := range ways {
			b.Run(fmt.Sprintf("catchup/%s/run%d", way, run), func(b *testing.B) {
				took := s.fanRead(b, way, false, want, nil)
				if way == "per-partition" {
					base = took
				} else if base > 0 {
					b.ReportMetric(base.Seconds()/took.Seconds(), "speed-vs-per-partition")
				}
			})
		}
	}

	n, rate := fanInEnv(b, "MESHFOLD_BENCH_FANIN_LIVE", 60_000), fanInEnv(b, "MESHFOLD_BENCH_FANIN_RATE", 10_000)
	in := enginetest.SimulateDenseInputs(n, max(n/100, 1))
	msgs := make([]*nats.Msg, len(in.Msgs))
	for i, m := range in.Msgs {
		msgs[i] = &nats.Msg{Subject: m.Subject, Data: m.Data} // no message id: each round publishes them again
	}
	for run := 1; run <= 2; run++ {
		var base time.Duration
		for _, way := range append([]string{"none"}, ways...) {
			b.Run(fmt.Sprintf("live/%s/run%d", way, run), func(b *testing.B) {
				took := s.fanRead(b, way, true, len(msgs), func() { publishPaced(b, s.js, msgs, rate) })
				if way == "per-partition" {
					base = took
				} else if base > 0 && way != "none" {
					b.ReportMetric(base.Seconds()/took.Seconds(), "speed-vs-per-partition")
				}
			})
		}
	}
}

// fanInEnv is the positive integer in the environment variable name, or
// def.
func fanInEnv(tb testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		tb.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// fanInBudget is how long a read of BenchmarkReadFanIn may take before
// its figures are taken over what it read: MESHFOLD_BENCH_FANIN_BUDGET
// seconds, default 20 (the one-multifilter catch-up of 315,000 messages
// did not end in 3 minutes).
func fanInBudget(tb testing.TB) time.Duration {
	return time.Duration(fanInEnv(tb, "MESHFOLD_BENCH_FANIN_BUDGET", 20)) * time.Second
}

// fanRead reads want messages of s's stream the way way names
// (BenchmarkReadFanIn), from its first message, or, live, from its end
// while publish (when not nil) runs, and reports the figures; "none"
// reads nothing and times publish alone. It returns the time from the
// consumers' creation until the last message was handed to its
// partition's goroutine (live: until publish returned and every message
// arrived), divided by the messages read: the time an event.
func (s *outsideServer) fanRead(b *testing.B, way string, live bool, want int, publish func()) time.Duration {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	load := loadAvg()
	parts := s.cfg.Partitions
	subj := s.cfg.Subjects()
	var got atomic.Int64
	all := make(chan struct{})
	var once sync.Once
	count := func() {
		if got.Add(1) == int64(want) {
			once.Do(func() { close(all) })
		}
	}
	var wg sync.WaitGroup
	// drain is a partition's goroutine: it takes what its read hands it
	// and counts it, as a session takes its tail's messages.
	drain := func(ch <-chan store.Tailed) {
		defer wg.Done()
		for {
			select {
			case it := <-ch:
				if it.Err != nil {
					b.Error(it.Err)
					return
				}
				count()
			case <-ctx.Done():
				return
			}
		}
	}
	start := time.Now()
	self0, srv0 := selfCPU(b), s.srv.CPU()
	switch way {
	case "none":
		close(all)
	case "per-partition":
		for p := range parts {
			t, err := store.Follow(ctx, s.js, store.TailConfig{Stream: s.cfg.Name, Subjects: subj,
				Filter: subj.StoredPartitionAll(p), Start: 1, New: live, Heartbeat: time.Second, EndOnLoss: true})
			if err != nil {
				b.Fatal(err)
			}
			defer t.Stop()
			wg.Add(1)
			go drain(t.C())
		}
	default:
		var filters []string
		switch way {
		case "one-unfiltered":
		case "one-multifilter":
			for p := range parts {
				filters = append(filters, subj.StoredPartitionAll(p))
			}
		case "one-wildcard":
			filters = []string{"*." + strings.SplitN(subj.StoredPartitionAll(0), ".", 2)[1]}
		default:
			b.Fatalf("way %q", way)
		}
		policy := jetstream.DeliverAllPolicy
		if live {
			policy = jetstream.DeliverNewPolicy
		}
		cons, err := s.js.CreateConsumer(ctx, s.cfg.Name, jetstream.ConsumerConfig{DeliverPolicy: policy,
			FilterSubjects: filters, AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: store.OrderedInactive,
			Replicas: 1, MemoryStorage: true})
		if err != nil {
			b.Fatal(err)
		}
		defer store.DropOrdered(s.js, s.cfg.Name, cons)
		chans := make([]chan store.Tailed, parts)
		for p := range chans {
			chans[p] = make(chan store.Tailed, 64) // store's tail buffer
			wg.Add(1)
			go drain(chans[p])
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			x := store.Tailed{Msg: m}
			if x.Meta, x.Err = m.Metadata(); x.Err != nil {
				b.Error(x.Err)
				return
			}
			// The partition is the stored subject's first token.
			sj := m.Subject()
			i := strings.IndexByte(sj, '.')
			p, err := strconv.Atoi(sj[:max(i, 0)])
			if err != nil || p < 0 || p >= parts {
				b.Errorf("subject %q: no partition token", sj)
				return
			}
			select {
			case chans[p] <- x:
			case <-ctx.Done():
			}
		}, jetstream.PullHeartbeat(time.Second))
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Stop()
	}
	if publish != nil {
		publish()
	}
	read := want
	select {
	case <-all:
	case <-time.After(fanInBudget(b)):
		// Too slow to wait for (one-multifilter's catch-up): the
		// figures are those of the messages read so far.
		read = int(got.Load())
		b.Logf("%s: read %d of %d messages within the budget", way, read, want)
	}
	took := time.Since(start)
	self, srv := selfCPU(b)-self0, s.srv.CPU()-srv0
	cancel()
	wg.Wait()
	if read == 0 {
		b.Fatalf("%s: nothing read", way)
	}
	b.ReportMetric(float64(read)/float64(want), "read-fraction")
	n := float64(read)
	b.ReportMetric(took.Seconds(), "wall-s")
	b.ReportMetric(n/took.Seconds(), "events/s")
	b.ReportMetric(float64(srv.Nanoseconds())/n, "server-cpu-ns/event")
	b.ReportMetric(float64(self.Nanoseconds())/n, "client-cpu-ns/event")
	if f, err := strconv.ParseFloat(strings.Fields(load)[0], 64); err == nil {
		b.ReportMetric(f, "load1")
	}
	b.Logf("%s: %d messages in %v, load %s → %s", way, read, took.Round(time.Millisecond), load, loadAvg())
	return took / time.Duration(read)
}

// publishPaced publishes msgs on js at rate a second, a batch every
// 10 ms, asynchronously, and waits for every ack.
func publishPaced(tb testing.TB, js jetstream.JetStream, msgs []*nats.Msg, rate int) {
	tb.Helper()
	const tick = 10 * time.Millisecond
	batch := max(rate/100, 1)
	start := time.Now()
	var prev []jetstream.PubAckFuture
	for i := 0; i < len(msgs); i += batch {
		if d := time.Until(start.Add(time.Duration(i/batch) * tick)); d > 0 {
			time.Sleep(d) // the pace, not a wait for an event
		}
		futs := make([]jetstream.PubAckFuture, 0, batch)
		for _, m := range msgs[i:min(i+batch, len(msgs))] {
			f, err := js.PublishMsgAsync(m)
			if err != nil {
				tb.Fatal(err)
			}
			futs = append(futs, f)
		}
		if err := awaitAcks(prev); err != nil {
			tb.Fatal(err)
		}
		prev = futs
	}
	if err := awaitAcks(prev); err != nil {
		tb.Fatal(err)
	}
}

func awaitAcks(futs []jetstream.PubAckFuture) error {
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		}
	}
	return nil
}
