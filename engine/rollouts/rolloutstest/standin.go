package rolloutstest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// Answer follows the stream's plans stored after start (0: from now) and
// answers each with a settle per module and a have, published without
// waiting for each acknowledgement (at most 1,024 in flight), until ctx
// ends (it then returns nil). A plan of a node for which skip returns
// true is not answered (an agent that is down).
//
// Errors: the follow's or a publish's.
func Answer(ctx context.Context, js jetstream.JetStream, cfg store.StreamConfig, start uint64, skip func(node string) bool) error {
	cfg = cfg.WithDefaults()
	subj := cfg.Subjects()
	tc := store.TailConfig{Stream: cfg.Name, Subjects: subj, Filter: "*." + subj.Event("*", events.KindPlan)}
	if start == 0 {
		tc.New = true
	} else {
		tc.Start = start
	}
	// The plans are read as a node agent reads them (store.FollowNode):
	// through a consumer that ends on its loss, made again from after
	// the last plan read. The client's ordered consumer, re-made under
	// one name, can stay on a server killed -9 until it returns, and the
	// stand-ins then answered nothing (TestPausedRolloutResumesAcrossTheStreamLeadersKill).
	tc.EndOnLoss, tc.Heartbeat = true, time.Second
	tail, err := store.FollowRidingOut(ctx, js, tc)
	if err != nil {
		return err
	}
	defer func() { go tail.Stop() }()
	pub := store.NewPublisher(js, subj)
	inflight := make(chan jetstream.PubAckFuture, 1024)
	errc := make(chan error, 1)
	go func() {
		for f := range inflight {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				select {
				case errc <- err:
				default:
				}
			case <-ctx.Done():
			}
		}
	}()
	defer close(inflight)
	send := func(node string, p events.Payload) error {
		f, err := pub.AppendAsync(ctx, node, events.Stamp(p, time.Now()))
		if err != nil {
			return err
		}
		select {
		case inflight <- f:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
	var read uint64 // the last plan read
	for {
		m, err := tail.Next(ctx)
		if errors.Is(err, store.ErrConsumerLost) && ctx.Err() == nil {
			go tail.Stop()
			tc.New, tc.Start = false, read+1
			if read == 0 {
				tc.New, tc.Start = start == 0, start
			}
			if tail, err = store.FollowRidingOut(ctx, js, tc); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		read = m.Event.Seq
		select {
		case err := <-errc:
			return fmt.Errorf("stand-in publish: %w", err)
		default:
		}
		plan, ok := m.Event.Payload.(*events.Plan)
		if !ok || skip != nil && skip(m.Event.Node) {
			continue
		}
		have := &events.Have{Modules: make([]events.HaveModule, 0, len(plan.Modules))}
		for _, pm := range plan.Modules {
			if err := send(m.Event.Node, &events.Settle{Module: pm.Name, Op: events.OpApply, Plan: m.Event.Seq}); err != nil {
				return err
			}
			have.Modules = append(have.Modules, events.HaveModule{Name: pm.Name, Build: pm.Build, State: events.Running, Account: pm.RunsAs})
		}
		if len(plan.Modules) == 0 {
			if err := send(m.Event.Node, &events.Settle{Op: events.OpApply, Plan: m.Event.Seq}); err != nil {
				return err
			}
		}
		if err := send(m.Event.Node, have); err != nil {
			return err
		}
	}
}
