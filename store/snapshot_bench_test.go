package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
	"github.com/nats-io/nats.go/jetstream"
)

// benchSnapshots fills partition 3 with n node states of ~600 bytes.
func benchSnapshots(b *testing.B, n int) (jetstream.JetStream, *store.Snapshots) {
	b.Helper()
	ctx := context.Background()
	_, _, js, _, cfg := storetest.StartStream(b, store.StreamConfig{})
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		b.Fatal(err)
	}
	state := make([]byte, 600)
	for i := range state {
		state[i] = 'x'
	}
	states := make(map[string][]byte, n)
	for i := range n {
		states[fmt.Sprintf("node-%05d", i)] = state
	}
	start := time.Now()
	if err := snaps.PutNodes(ctx, 3, states); err != nil {
		b.Fatal(err)
	}
	b.Logf("PutNodes: %d states in %v (%.0f/s)", n, time.Since(start), float64(n)/time.Since(start).Seconds())
	return js, snaps
}

// BenchmarkLoadPartition10k: the KV watch LoadPartition uses.
func BenchmarkLoadPartition10k(b *testing.B) {
	_, snaps := benchSnapshots(b, 10000)
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		_, nodes, err := snaps.LoadPartition(ctx, 3)
		if err != nil || len(nodes) != 10000 {
			b.Fatalf("%d nodes, %v", len(nodes), err)
		}
	}
}

// BenchmarkLoadPartition10kOrdered: the alternative, a pull-based ordered
// consumer with DeliverLastPerSubject on the bucket's stream.
func BenchmarkLoadPartition10kOrdered(b *testing.B) {
	js, _ := benchSnapshots(b, 10000)
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		cons, err := js.OrderedConsumer(ctx, "KV_MESH_SNAPSHOTS", jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{"$KV.MESH_SNAPSHOTS.node.3.*"},
			DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		})
		if err != nil {
			b.Fatal(err)
		}
		it, err := cons.Messages()
		if err != nil {
			b.Fatal(err)
		}
		nodes := map[string][]byte{}
		for {
			m, err := it.Next()
			if err != nil {
				b.Fatal(err)
			}
			nodes[m.Subject()] = m.Data()
			meta, _ := m.Metadata()
			if meta.NumPending == 0 {
				break
			}
		}
		it.Stop()
		if len(nodes) != 10000 {
			b.Fatalf("%d nodes", len(nodes))
		}
	}
}

// BenchmarkPutNode: one synchronous put at a time, for comparison with
// PutNodes.
func BenchmarkPutNode(b *testing.B) {
	_, snaps := benchSnapshots(b, 1)
	ctx := context.Background()
	state := make([]byte, 600)
	i := 0
	for b.Loop() {
		if err := snaps.PutNode(ctx, 3, fmt.Sprintf("node-%05d", i%10000), state); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkPutNodesAt: a checkpoint's fenced puts of 256 states of ~600
// bytes (each at its revision), through the JetStream context's
// PublishMsgAsync ("client") and through a Publisher
// (Snapshots.PublishThrough, "publisher"); one op is one put.
func BenchmarkPutNodesAt(b *testing.B) {
	for _, through := range []string{"client", "publisher"} {
		b.Run(through, func(b *testing.B) {
			ctx := context.Background()
			_, _, js, _, cfg := storetest.StartStream(b, store.StreamConfig{})
			snaps, err := store.OpenSnapshots(ctx, js, cfg)
			if err != nil {
				b.Fatal(err)
			}
			if through == "publisher" {
				snaps.PublishThrough(store.NewPublisher(js, cfg.Subjects()))
			}
			state := make([]byte, 600)
			const n = 256
			states := make(map[string][]byte, n)
			for i := range n {
				states[fmt.Sprintf("node-%05d", i)] = state
			}
			revs := make(map[string]uint64, n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += n {
				if err := snaps.PutNodesAt(ctx, 3, states, revs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
