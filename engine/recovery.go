package engine

import (
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile"
)

// effectKey names one node's subject of one effect kind.
type effectKey struct {
	node string
	kind events.Kind
}

// recovery decides, while a session re-reads the range an earlier run may
// have published effects for, which of the effects folded in that range
// were stored already (docs/architecture.md, "Exactly-once effects"). It is
// a pure value: the session feeds it the effects it defers and the effect
// messages it reads, and publishes what is left.
//
// An effect is stored when a message carrying its id is read; a plan also
// when a later plan of its node is read (a superseded plan is never
// published after a newer one). Every effect message read, its id valid or
// not, moves its subject's fence: the sequence the deferred effect is
// published behind (Nats-Expected-Last-Subject-Sequence).
type recovery struct {
	// deferred holds the effects deferred, in the order folded, each
	// with its id (Effect.ID), made once.
	deferred []toPublish
	// unstored holds the ids of deferred effects not seen stored; plans
	// holds each node's deferred plans, in order: a plan seen supersedes
	// only its own node's (a scan of every deferred effect at each plan
	// seen made a cold catch-up quadratic, issue 17). Both stay nil until
	// the first effect message with a valid id is read (index): until
	// then every deferred effect is unstored, and a first refold, which
	// reads none, never builds them (issue 27).
	unstored map[string]bool
	plans    map[string][]toPublish
	// last is each effect subject's last sequence seen or published.
	last map[effectKey]uint64
	// compacted counts the deferred effects dropped by compact since the
	// last forget, each seen stored (or superseded).
	compacted int
}

func newRecovery() *recovery {
	return &recovery{last: map[effectKey]uint64{}}
}

// deferEffect keeps e until the read passes the session's start.
func (r *recovery) deferEffect(e reconcile.Effect) { r.deferCaused(e, "") }

// deferCaused is deferEffect of e whose cause carried traceparent tp
// (kept only while tracing: recoveryTrace.publishing).
func (r *recovery) deferCaused(e reconcile.Effect, tp string) {
	d := toPublish{e: e, id: e.ID(), tp: tp}
	r.deferred = append(r.deferred, d)
	if r.unstored != nil {
		r.note(d)
	}
}

// note indexes deferred effect d as unstored.
func (r *recovery) note(d toPublish) {
	r.unstored[d.id] = true
	if d.e.Kind == events.KindPlan {
		r.plans[d.e.Node] = append(r.plans[d.e.Node], d)
	}
}

// index builds unstored and plans from every effect deferred so far,
// none of them seen stored yet, unless built already.
func (r *recovery) index() {
	if r.unstored != nil {
		return
	}
	r.unstored, r.plans = make(map[string]bool, len(r.deferred)), map[string][]toPublish{}
	for _, d := range r.deferred {
		r.note(d)
	}
}

// seen notes an effect message read at seq on node's subject of kind;
// id is the effect id its message id carries, valid false when the
// message id is not one this stream's reconcilers made (a forgery at
// worst): such a message stores nothing but still moves the fence.
func (r *recovery) seen(node string, kind events.Kind, seq uint64, id string, valid bool) {
	r.last[effectKey{node, kind}] = seq
	if !valid {
		return
	}
	idNode, _, cause, n, ok := reconcile.ParseEffectID(id)
	if !ok || idNode != node {
		return
	}
	r.index()
	delete(r.unstored, id)
	if kind == events.KindPlan {
		for _, d := range r.plans[node] {
			if d.e.Cause < cause || (d.e.Cause == cause && d.e.N < n) {
				delete(r.unstored, d.id)
			}
		}
	}
	r.compact()
}

// compact drops the deferred effects once every one of them is seen
// stored (or superseded): none is left to publish, to find by id or to
// supersede, so keeping them only held their payloads. A refold of a
// history whose effects are stored (a cold refold, a restart) is settled
// after almost every effect it reads, and without a recovery checkpoint
// (RecoveryCheckpointInterval, 30 s) it kept every effect of the range:
// at 100,000 nodes a live heap growing with the events, which every
// collection of the refold marked (issue 27, a cold refold's cost per
// node). The fences are kept, as forget keeps them.
func (r *recovery) compact() {
	if r.unstored == nil || len(r.unstored) > 0 || len(r.deferred) == 0 {
		return
	}
	for _, d := range r.deferred {
		if d.e.Kind == events.KindPlan {
			delete(r.plans, d.e.Node) // plans holds deferred effects only
		}
	}
	r.compacted += len(r.deferred)
	clear(r.deferred) // their payloads go; the array is reused
	r.deferred = r.deferred[:0]
}

// skipped is how many effects deferred since the last forget were seen
// stored or superseded, given that queued of them are left to publish.
func (r *recovery) skipped(queued int) int { return len(r.deferred) + r.compacted - queued }

// unstoredPlan returns node's deferred plan of effect id id, when it is
// not seen stored (nor superseded) yet.
func (r *recovery) unstoredPlan(node, id string) (reconcile.Effect, bool) {
	r.index()
	if !r.unstored[id] {
		return reconcile.Effect{}, false
	}
	_, kind, cause, n, ok := reconcile.ParseEffectID(id)
	if !ok || kind != events.KindPlan {
		return reconcile.Effect{}, false
	}
	ps := r.plans[node]
	for i := len(ps) - 1; i >= 0; i-- {
		if ps[i].e.Cause == cause && ps[i].e.N == n {
			return ps[i].e, true
		}
	}
	return reconcile.Effect{}, false
}

// stored reports whether deferred effect e was seen stored (or superseded).
func (r *recovery) stored(e reconcile.Effect) bool { return r.unstored != nil && !r.unstored[e.ID()] }

// toPublish is a deferred effect with its id; or, with poison set, the
// journal entry that stands in for an effect that can never be stored
// (session.poisonEntry): e is that entry, on its node's journal subject,
// and id the skipped effect's, under which it is published.
// tp is the traceparent of e's cause, kept while tracing (empty when
// off, or the cause carried none).
type toPublish struct {
	e      reconcile.Effect
	id     string
	tp     string
	poison bool
}

// unpublished returns the deferred effects not seen stored (nor
// superseded), by subject: each subject's in the order folded, and the
// subjects in the order of their first such effect.
func (r *recovery) unpublished() (order []effectKey, queues map[effectKey][]toPublish) {
	queues = map[effectKey][]toPublish{}
	for _, d := range r.deferred {
		if r.unstored != nil && !r.unstored[d.id] {
			continue
		}
		k := effectKey{d.e.Node, d.e.Kind}
		q, ok := queues[k]
		if !ok {
			order = append(order, k)
		}
		queues[k] = append(q, d)
	}
	return order, queues
}

// fence returns the last sequence seen or published on e's subject since
// the checkpoint; known is false when there is none (the subject's last
// message, if any, is older: ask the stream).
func (r *recovery) fence(e reconcile.Effect) (seq uint64, known bool) {
	seq, known = r.last[effectKey{e.Node, e.Kind}]
	return seq, known
}

// settled reports whether every effect deferred so far was seen stored
// or superseded: none is left to publish, so a checkpoint at the read's
// position loses nothing (session.checkpointNow).
func (r *recovery) settled() bool {
	if r.unstored == nil {
		return len(r.deferred) == 0
	}
	return len(r.unstored) == 0
}

// forget drops the deferred effects once settled: each was seen stored
// (or superseded), and a checkpoint now covers their causes. The fences
// seen are kept: a later deferred effect of the same subject is published
// behind them.
func (r *recovery) forget() {
	r.deferred = nil
	r.compacted = 0
	clear(r.plans)
}

// published records that e was stored at seq: the next effect of its
// subject is fenced behind it.
func (r *recovery) published(e reconcile.Effect, seq uint64) {
	r.last[effectKey{e.Node, e.Kind}] = seq
}

// fenceAfter returns a subject's fence once an effect published behind
// fence was acknowledged with ack: the later of the two. An ack is a new
// message's sequence, past fence; a duplicate's is that of the copy
// stored first (a predecessor's publish of the same effect), which may be
// older than a fence read since (reviewer's finding). Both sequences are
// of messages the subject held, so its last sequence is at least the
// later one, and a fence at the earlier one, when they differ, is stale
// for certain: the next publish would fail it (a restart). The later one
// is never worse; a message stored past it since is still refused.
func fenceAfter(fence uint64, ack *jetstream.PubAck) uint64 {
	return max(fence, ack.Sequence)
}
