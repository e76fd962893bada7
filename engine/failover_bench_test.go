package engine_test

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

var failoverKills = flag.Int("failover-kills", 20, "BenchmarkClusterFailover: kills of each kind")

// BenchmarkClusterFailover measures, on a 3-server cluster of nats-server
// processes (R3) under a group of two reconcilers with the default lease
// TTL, the time from a kill to the first plan of a want sent right after
// it: for the server leading the stream and the server leading the lease
// bucket (SIGKILL; restarted, and the group settled, before the next
// kill), and for a member of the group (its connection closed under it,
// as a crash; a new member of the same name joins before the next kill).
// p50-ms and p99-ms per kind, over -failover-kills kills each (20).
//
//	go test ./engine -run '^$' -bench ClusterFailover -benchtime 1x -timeout 60m
func BenchmarkClusterFailover(b *testing.B) {
	for range b.N {
		pc := storetest.StartProcCluster(b, 3)
		_, js := pc.Connect(b)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		stream, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		pub := store.NewPublisher(js, cfg.Subjects())
		ttl := engine.DefaultLeaseTTL
		a := startBenchMember(b, pc.Connect, cfg, "a", ttl, engine.Faults{})
		m := startBenchMember(b, pc.Connect, cfg, "b", ttl, engine.Faults{})
		settled := func() {
			deadline := time.Now().Add(3 * time.Minute)
			for len(a.g.Owned()) != 8 || len(m.g.Owned()) != 8 || len(a.r.Owned()) != 8 || len(m.r.Owned()) != 8 {
				if time.Now().After(deadline) {
					b.Fatalf("the group did not settle: a %v, b %v", a.r.Owned(), m.r.Owned())
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		settled()
		node := nodesIn(cfg.Partitions, 0, 8, 1)[0] // a's half
		build := 0
		// planAfter sends a new want of node and returns the time from
		// killed to its plan.
		planAfter := func(killed time.Time) time.Duration {
			build++
			w := events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "app", Build: fmt.Sprintf("a:%d", build)}}}, time.Now().UTC())
			var seq uint64
			for {
				actx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				ack, err := pub.Append(actx, node, w, store.WithMsgID(fmt.Sprintf("failover-%d", build)))
				cancel()
				if err == nil {
					seq = ack.Seq
					break
				}
				if time.Since(killed) > 3*time.Minute {
					b.Fatalf("append: %v", err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			for {
				qctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				msg, err := store.LastMsg(qctx, stream, cfg.Subjects(), node, events.KindPlan)
				cancel()
				if err == nil {
					if p, ok := msg.Event.Payload.(*events.Plan); ok && p.Cause >= seq {
						return time.Since(killed)
					}
				}
				if time.Since(killed) > 3*time.Minute {
					b.Fatalf("no plan of want %d %v after the kill", seq, time.Since(killed))
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		report := func(kind string, ds []time.Duration) {
			slices.Sort(ds)
			p := func(q float64) time.Duration { return ds[max(0, int(float64(len(ds))*q+0.999999)-1)] }
			b.Logf("%s: %d kills, first plan of a new want after p50 %v, p99 %v (min %v, max %v); all %v", kind, len(ds),
				p(0.5).Round(time.Millisecond), p(0.99).Round(time.Millisecond), ds[0].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond), ds)
			b.ReportMetric(float64(p(0.5).Milliseconds()), kind+"-p50-ms")
			b.ReportMetric(float64(p(0.99).Milliseconds()), kind+"-p99-ms")
		}
		for _, k := range []chaosKill{{"stream", cfg.Name}, {"lease", "KV_" + cfg.Name + engine.LeaseBucketSuffix}} {
			var ds []time.Duration
			for range *failoverKills {
				leader := -1
				for leader < 0 {
					qctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					leader = pc.Leader(qctx, js, k.stream)
					cancel()
				}
				killed := time.Now()
				pc.Kill(leader)
				ds = append(ds, planAfter(killed))
				pc.Restart(leader)
				settled()
			}
			report(k.what, ds)
		}
		var ds []time.Duration
		for range *failoverKills {
			killed := time.Now()
			a.nc.Close()
			a.cancel()
			ds = append(ds, planAfter(killed))
			<-a.done
			a = startBenchMember(b, pc.Connect, cfg, "a", ttl, engine.Faults{})
			settled()
		}
		report("instance", ds)
	}
}

// BenchmarkBucketElection measures how long an R3 KV bucket takes no
// write after the server leading it is killed with SIGKILL: from the
// kill to the first put that succeeds (each put bounded by 500 ms,
// tried every 20 ms), over -failover-kills kills (20), the server
// restarted between kills. The lease TTL must outlive it.
//
//	go test ./engine -run '^$' -bench BucketElection -benchtime 1x -timeout 30m
func BenchmarkBucketElection(b *testing.B) {
	for range b.N {
		pc := storetest.StartProcCluster(b, 3)
		_, js := pc.Connect(b)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "ELECTION", Replicas: 3, Storage: jetstream.FileStorage})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		var ds []time.Duration
		for range *failoverKills {
			leader := -1
			for leader < 0 {
				qctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				leader = pc.Leader(qctx, js, "KV_ELECTION")
				cancel()
			}
			killed := time.Now()
			pc.Kill(leader)
			for {
				pctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				_, err := kv.Put(pctx, "k", []byte("v"))
				cancel()
				if err == nil {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			ds = append(ds, time.Since(killed))
			pc.Restart(leader)
		}
		slices.Sort(ds)
		b.Logf("%d kills of the bucket's leader: no write for %v (p50) to %v (max); all %v", len(ds), ds[len(ds)/2], ds[len(ds)-1], ds)
		b.ReportMetric(float64(ds[len(ds)/2].Milliseconds()), "p50-ms")
		b.ReportMetric(float64(ds[len(ds)-1].Milliseconds()), "max-ms")
	}
}
