package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
)

// TestKnockLatency measures, over 1,000 rounds, the time from a settle's
// publish to the knock it causes reaching a consumer that follows knocks
// the way the provisioner does (an ordered consumer), beside a raw
// publish → ordered-consume hop on a plain stream in the same run. Each
// round uses a new node: want → plan; a refusal at plan 0 (owed); then the
// settle that accepts it, timed until its knock arrives. The figures are
// logged; the test fails only if a knock never comes. Skipped with -short.
func TestKnockLatency(t *testing.T) {
	// Not parallel: it measures latency.
	if testing.Short() {
		t.Skip("latency measurement")
	}
	const rounds = 1000
	m := newMesh(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	subj := m.cfg.Subjects()

	follow := func(stream string, filter string) jetstream.MessagesContext {
		cons := must(m.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverNewPolicy}))(t)
		it := must(cons.Messages())(t)
		t.Cleanup(it.Stop)
		return it
	}
	plans := follow(m.cfg.Name, "*."+subj.Prefix+".*.plan")
	knocks := follow(m.cfg.Name, "*."+subj.Prefix+".*.knock")
	next := func(it jetstream.MessagesContext) jetstream.Msg {
		return must(it.Next(jetstream.NextContext(ctx)))(t)
	}

	knock := make([]time.Duration, 0, rounds)
	for i := range rounds {
		name := fmt.Sprintf("lat-%04d", i)
		if _, err := m.want(ctx, name, provisionerMod, mbgMod); err != nil {
			t.Fatal(err)
		}
		pm := next(plans)
		meta := must(pm.Metadata())(t)
		plan := meta.Sequence.Stream
		ref := events.Stamp(&events.Refusal{Module: mbg, Path: creds, Reason: events.ReasonNoAccount, Plan: 0, Writer: "prov"}, time.Now())
		if _, err := m.pub.Append(ctx, name, ref); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := m.pub.Append(ctx, name, events.Stamp(&events.Settle{Module: mbg, Op: events.OpApply, Plan: plan}, time.Now())); err != nil {
			t.Fatal(err)
		}
		km := next(knocks)
		knock = append(knock, time.Since(start))
		if _, node, _ := cut3(km.Subject()); node != name {
			t.Fatalf("knock for %s, want %s", node, name)
		}
	}

	// The raw hop: publish to a plain stream, receive with an ordered
	// consumer.
	if _, err := m.js.CreateStream(ctx, jetstream.StreamConfig{Name: "RAW", Subjects: []string{"raw.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	raw := follow("RAW", "raw.>")
	hop := make([]time.Duration, 0, rounds)
	for range rounds {
		start := time.Now()
		if _, err := m.js.Publish(ctx, "raw.x", []byte(`{"v":1}`)); err != nil {
			t.Fatal(err)
		}
		next(raw)
		hop = append(hop, time.Since(start))
	}
	p50, p99 := pct(knock, 50), pct(knock, 99)
	h50, h99 := pct(hop, 50), pct(hop, 99)
	t.Logf("knock latency (settle published → knock delivered), %d rounds: p50 %s p99 %s", rounds, p50, p99)
	t.Logf("raw publish → ordered consume hop, %d rounds:             p50 %s p99 %s", rounds, h50, h99)
	t.Logf("ratio p50 %.1fx, p99 %.1fx", float64(p50)/float64(h50), float64(p99)/float64(h99))
}

func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100].Round(time.Microsecond)
}

// cut3 splits a stored subject <p>.<prefix>.<node>.<kind>.
func cut3(subject string) (prefix, node, kind string) {
	var parts [4]string
	n := 0
	start := 0
	for i := 0; i <= len(subject) && n < 4; i++ {
		if i == len(subject) || subject[i] == '.' {
			parts[n] = subject[start:i]
			n++
			start = i + 1
		}
	}
	return parts[1], parts[2], parts[3]
}
