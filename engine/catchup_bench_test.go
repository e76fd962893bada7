package engine_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// rawDecode is the baseline of issue 17: one ordered consumer a
// partition, in parallel, as the reconciler reads, each message's
// payload decoded (events.DecodeEvent: encoding/json into the kind's
// type, as the fold decodes it) and nothing else, until want messages
// have arrived. It returns how long that took.
func rawDecode(tb testing.TB, js jetstream.JetStream, cfg store.StreamConfig, want int) time.Duration {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	subj := cfg.Subjects()
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
				meta, err := m.Metadata()
				if err != nil {
					tb.Error(err)
					return
				}
				if _, err := subj.DecodeEvent(m.Subject(), m.Data(), meta.Sequence.Stream, meta.Timestamp); err != nil {
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

// catchUpSize is the history of BenchmarkCatchUp: 300,000 events over
// 3,000 nodes (the size issue 17 measured from outside), not the 1M over
// 10,000 of the target: building, loading and folding 1M events
// twice per case takes minutes on this 2-core machine, and the ratio is
// what the figure is about. CATCHUP=1m is not offered: run
// BenchmarkGroupThroughput for the 1M history.
const catchUpEvents, catchUpNodes = 300_000, 3_000

// BenchmarkCatchUp is figure 1 of issue 17: a cold catch-up (no
// snapshot) by one reconciler, against a raw ordered read with decoding
// of the same messages on the same server in the same run.
//
//   - stored: the history with its effects stored, as after a crash
//     before any checkpoint: every effect is recognised and skipped.
//   - unstored: the history's inputs only (wants and haves), as a first
//     refold that must publish its plans.
//
// The time runs from the reconciler's start until it has folded every
// partition's last input event and a graceful stop has waited for every
// ack and written the snapshots. The process's CPU time per event is
// reported for both (the embedded server's share included in each).
//
//	go test ./engine -run '^$' -bench CatchUp -benchtime 1x
func BenchmarkCatchUp(b *testing.B) {
	h := simulate(catchUpEvents, catchUpNodes)
	var inputs []*nats.Msg
	for _, m := range h.msgs {
		if _, kind, _ := (events.Subjects{}).Parse(m.Subject); kind == events.KindWant || kind == events.KindHave {
			inputs = append(inputs, m)
		}
	}
	for _, c := range []struct {
		name string
		h    *history
	}{{"stored", h}, {"unstored", &history{msgs: inputs}}} {
		b.Run(c.name, func(b *testing.B) {
			n := len(c.h.msgs)
			for range b.N {
				_, _, js, _, cfg := storetest.StartStream(b, store.StreamConfig{})
				c.h.load(b, js)
				runtime.GC()
				cpu0 := cpuTime(b)
				raw := rawDecode(b, js, cfg, n)
				rawCPU := cpuTime(b) - cpu0
				runtime.GC()
				cpu0 = cpuTime(b)
				took := foldAll(b, js, cfg)
				foldCPU := cpuTime(b) - cpu0
				// CPU of the whole process (the embedded server's share
				// included in both): steadier than the rates while other
				// work shares the cores.
				b.ReportMetric(float64(rawCPU.Nanoseconds())/float64(n), "raw-cpu-ns/event")
				b.ReportMetric(float64(foldCPU.Nanoseconds())/float64(n), "fold-cpu-ns/event")
				b.ReportMetric(float64(n), "events")
				b.ReportMetric(float64(n)/raw.Seconds(), "raw-decode-events/s")
				b.ReportMetric(float64(n)/took.Seconds(), "fold-events/s")
				b.ReportMetric(raw.Seconds()/took.Seconds(), "ratio")
			}
		})
	}
}
