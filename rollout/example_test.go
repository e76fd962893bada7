package rollout_test

import (
	"fmt"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/fleetfile"
)

// Example drives a rollout the way a controller does: apply computes
// each node's want from the fleet file and starts a rollout over the
// nodes whose want changes; the controller folds every event in stream
// order and carries out the effects (here the stream, the server and the
// nodes are a slice and a few lines).
func Example() {
	file := []byte(`fleet: web
nodes: {ace: {}, bob: {}, cat: {}}
groups:
  - name: all
    select: {}
    modules: [{name: web, build: b2}]
rollout: {batch: 1, max_unavailable: 1, min_healthy: 0s}
`)
	fleet, _, err := fleetfile.Parse(file)
	if err != nil {
		panic(err)
	}
	// The stream already holds each node's want of build b1, at 1, 2, 3.
	var cands []rollout.Candidate
	for i, n := range fleet.Nodes {
		want, _ := fleet.Want(n.Name)
		cands = append(cands, rollout.Candidate{Node: n.Name, Want: want, Prev: uint64(i + 1),
			Current: []events.WantModule{{Name: "web", Build: "b1"}}})
	}
	start, _ := rollout.NewStart("alice", "", fleet.Rollout, cands)

	s := rollout.NewState(fleet.Name)
	seq := uint64(3)
	var queue []rollout.Input
	add := func(in rollout.Input) uint64 {
		seq++
		in.Seq, in.Time = seq, time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC).Add(time.Duration(seq)*time.Second)
		queue = append(queue, in)
		return seq
	}
	add(rollout.Input{Kind: rollout.KindStart, Payload: start})
	for len(queue) > 0 {
		in := queue[0]
		queue = queue[1:]
		for _, e := range s.Fold(in) {
			if r := e.Record; r != nil {
				fmt.Printf("%s: %s\n", r.What, r.Msg)
				continue
			}
			// Publish the want (expecting e.Want.Expect), record the
			// outcome; the node's reconciler plans it, the node applies
			// it and reports it running.
			w := e.Want
			fmt.Printf("publish %s\n", e.ID())
			want := add(rollout.Input{Node: w.Node, Kind: rollout.KindWant})
			add(rollout.Input{Kind: rollout.KindPublished, Payload: &rollout.Published{Rollout: w.Rollout, Node: w.Node, Step: w.Step, Want: want}})
			plan := add(rollout.Input{Node: w.Node, Kind: rollout.KindPlan, Payload: &events.Plan{Cause: want, Want: want, Modules: []events.PlanModule{{Name: "web", Build: "b2"}}}})
			add(rollout.Input{Node: w.Node, Kind: rollout.KindSettle, Payload: &events.Settle{Op: events.OpApply, Plan: plan}})
			add(rollout.Input{Node: w.Node, Kind: rollout.KindHave, Payload: &rollout.Have{Modules: []rollout.HaveModule{{Name: "web", Build: "b2", State: events.Running}}}})
		}
	}
	v := s.View()
	fmt.Println(v.Phase, v.Counts[rollout.Done], "done; web", v.Builds[0].Build, "on", v.Builds[0].Nodes, "nodes")
	// Output:
	// running: rollout 4 by alice: 3 targets of 3 nodes in 3 batches (canary 0, batch 1), max_unavailable 1, min_healthy 0s, healthy_deadline 5m0s, auto_revert false
	// publish web.rollout.4.ace.forward
	// done: target ace done: every module ran at its build, healthy, from 2026-12-01T20:00:09Z for min_healthy 0s
	// batch: batch 2 of 3 begins: 1 target
	// publish web.rollout.4.bob.forward
	// done: target bob done: every module ran at its build, healthy, from 2026-12-01T20:00:14Z for min_healthy 0s
	// batch: batch 3 of 3 begins: 1 target
	// publish web.rollout.4.cat.forward
	// done: target cat done: every module ran at its build, healthy, from 2026-12-01T20:00:19Z for min_healthy 0s
	// completed: rollout 4 completed: 3 targets done, 0 unreached
	// completed 3 done; web b2 on 3 nodes
}
