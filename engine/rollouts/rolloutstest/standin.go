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

// answerWait is how long a stand-in's answer waits for its
// acknowledgement before it is sent again (a node agent's wait).
const answerWait = 5 * time.Second

// errAnswerLost: an answer's acknowledgement did not come in answerWait.
var errAnswerLost = errors.New("rolloutstest: no acknowledgement")

// Answer follows the stream's plans stored after start (0: from now) and
// answers each with a settle per module and a have, published without
// waiting for each acknowledgement (at most 1,024 in flight), until ctx
// ends (it then returns nil). A plan of a node for which skip returns
// true is not answered (an agent that is down).
//
// Each answer carries a message id (its plan's sequence, kind and index)
// and is sent again, as a node agent's are, when its acknowledgement does
// not come within answerWait or says the stream did not answer
// (store.Transient: no leader, no responders): a copy stored before is a
// duplicate. js need have no publish-async timeout. Before, an answer
// sent while the stream's leader was killed was lost without a word (its
// future never resolved) or ended the stand-ins, and the rollout waited
// for a settle that never came
// (TestPausedRolloutResumesAcrossTheStreamLeadersKill).
//
// Errors: the follow's, or a publish's that is not transient.
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
	type answer struct {
		f    jetstream.PubAckFuture
		node string
		p    events.Payload
		id   string
	}
	inflight := make(chan answer, 1024)
	errc := make(chan error, 1)
	fail := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	go func() {
		for a := range inflight {
			if ctx.Err() != nil {
				continue
			}
			timer := time.NewTimer(answerWait)
			var err error
			select {
			case <-a.f.Ok():
				timer.Stop()
				continue
			case err = <-a.f.Err():
				err = store.ServerError(err)
			case <-timer.C:
				err = errAnswerLost
			case <-ctx.Done():
			}
			timer.Stop()
			if ctx.Err() != nil {
				continue
			}
			if err != errAnswerLost && !store.Transient(err) {
				fail(err)
				continue
			}
			// Sent again under its id, until stored (a copy of one
			// stored before is a duplicate) or ctx ends.
			if _, err := pub.AppendRetrying(ctx, a.node, a.p, store.WithMsgID(a.id)); err != nil && ctx.Err() == nil {
				fail(err)
			}
		}
	}()
	defer close(inflight)
	send := func(node string, plan uint64, i int, p events.Payload) error {
		id := fmt.Sprintf("%s.standin.%d.%s.%d", node, plan, p.Kind(), i)
		events.Stamp(p, time.Now())
		f, err := pub.AppendAsync(ctx, node, p, store.WithMsgID(id))
		if err != nil {
			return err
		}
		select {
		case inflight <- answer{f: f, node: node, p: p, id: id}:
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
		for i, pm := range plan.Modules {
			if err := send(m.Event.Node, m.Event.Seq, i, &events.Settle{Module: pm.Name, Op: events.OpApply, Plan: m.Event.Seq}); err != nil {
				return err
			}
			have.Modules = append(have.Modules, events.HaveModule{Name: pm.Name, Build: pm.Build, State: events.Running, Account: pm.RunsAs})
		}
		if len(plan.Modules) == 0 {
			if err := send(m.Event.Node, m.Event.Seq, 0, &events.Settle{Op: events.OpApply, Plan: m.Event.Seq}); err != nil {
				return err
			}
		}
		if err := send(m.Event.Node, m.Event.Seq, 0, have); err != nil {
			return err
		}
	}
}
