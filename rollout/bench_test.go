package rollout_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
)

// BenchmarkRollout10k folds a whole rollout over 10,000 nodes (batches of
// 10%, max_unavailable 10%, min_healthy 0): each step's want is
// published, planned, settled and reported running at once, and a tick
// comes every 100 inputs. It reports the fold's time per input and the
// state's size per target.
func BenchmarkRollout10k(b *testing.B) { rollout10k(b, false) }

// BenchmarkRevert10k folds the same rollout, then a revert of its 10,000
// done targets within max_unavailable 10%, each revert's want published,
// planned, settled and reported running at once.
func BenchmarkRevert10k(b *testing.B) { rollout10k(b, true) }

func rollout10k(b *testing.B, revert bool) {
	const nodes = 10_000
	total := 0
	defer func() { b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(total), "ns/input") }()
	for b.Loop() {
		s := rollout.NewState("web")
		seq := uint64(0)
		now := base
		var queue []rollout.Input
		next := func(in rollout.Input) rollout.Input {
			seq++
			now = now.Add(time.Millisecond)
			in.Seq, in.Time = seq, now
			return in
		}
		start := &rollout.Start{By: "ops", Pages: 1, Wants: [][]events.WantModule{{{Name: "web", Build: "b2"}}},
			Params: rollout.Params{Batch: rollout.Amount{N: 10, Percent: true}, MaxUnavailable: rollout.Amount{N: 10, Percent: true}, MinHealthy: rollout.Duration(0).Ptr()}}
		var all []rollout.NodeAtStart
		for i := range nodes {
			all = append(all, rollout.NodeAtStart{Node: fmt.Sprintf("n%05d", i), Want: 1, Prev: uint64(i + 1)})
		}
		seq = nodes
		start.Nodes = all[:rollout.MaxNodesPerEvent]
		start.Pages = nodes / rollout.MaxNodesPerEvent
		queue = append(queue, next(rollout.Input{Kind: rollout.KindStart, Payload: start}))
		id := seq
		for p := 1; p < start.Pages; p++ {
			queue = append(queue, next(rollout.Input{Kind: rollout.KindNodes, Payload: &rollout.Nodes{Rollout: id, Page: p, Nodes: all[p*rollout.MaxNodesPerEvent : (p+1)*rollout.MaxNodesPerEvent]}}))
		}
		inputs := 0
		for {
			if len(queue) == 0 {
				w, ok := s.NextWake()
				if !ok && revert && s.Rollout.Phase == rollout.Completed {
					queue = append(queue, next(rollout.Input{Kind: rollout.KindRevert, Payload: rollout.NewOperator(rollout.KindRevert, id, "ops", "")}))
					continue
				}
				if !ok {
					break
				}
				now = w
				queue = append(queue, next(rollout.Input{Kind: rollout.KindTick, Payload: &rollout.Tick{}}))
			}
			in := queue[0]
			queue = queue[1:]
			inputs++
			for _, e := range s.Fold(in) {
				if w := e.Want; w != nil {
					want := next(rollout.Input{Node: w.Node, Kind: rollout.KindWant})
					queue = append(queue, want,
						next(rollout.Input{Kind: rollout.KindPublished, Payload: &rollout.Published{Rollout: w.Rollout, Node: w.Node, Step: w.Step, Want: want.Seq}}))
					plan := next(rollout.Input{Node: w.Node, Kind: rollout.KindPlan, Payload: &events.Plan{Cause: want.Seq, Want: want.Seq, Modules: []events.PlanModule{{Name: "web", Build: "b2"}}}})
					queue = append(queue, plan,
						next(rollout.Input{Node: w.Node, Kind: rollout.KindSettle, Payload: &events.Settle{Op: events.OpApply, Plan: plan.Seq}}),
						next(rollout.Input{Node: w.Node, Kind: rollout.KindHave, Payload: &rollout.Have{Modules: []rollout.HaveModule{{Name: "web", Build: "b2", State: events.Running}}}}))
				}
			}
			if inputs%100 == 0 {
				queue = append(queue, next(rollout.Input{Kind: rollout.KindTick, Payload: &rollout.Tick{}}))
			}
		}
		if p := s.Rollout.Phase; p != rollout.Completed && !revert || p != rollout.Reverted && revert {
			v := s.View()
			b.Fatalf("rollout %s after %d inputs: batch %d/%d counts %v unavailable %d/%d next %d", p, inputs, v.Batch, v.Batches, v.Counts, v.Unavailable, v.Params.MaxUnavailable, s.Rollout.Next)
		}
		total += inputs
		snap, _ := json.Marshal(s)
		b.ReportMetric(float64(len(snap))/nodes, "snapshot-B/target")
	}
}
