package query

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
)

// Sources returns, per node, the files its provisioner could not fill
// and why (DESIGN.md §12), as the provisioners keep them in the fill
// status bucket (store.OpenFillStatus): of node, or of every node when
// node is "". They are live: a provisioner writes one as it notices it,
// and deletes it once the file is filled. No bucket yet (no reconciler of
// this version has started) is none. Of one node, they include a knock
// no provisioner answered ([Reader.Unanswered]).
//
// Errors: the stream's lookup; the bucket's read.
func (r *Reader) Sources(ctx context.Context, node string) (map[string][]audit.SourceProblem, error) {
	_, cfg, err := r.open(ctx)
	if err != nil {
		return nil, err
	}
	kv, err := store.OpenFillStatus(ctx, r.js, cfg, false)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		// No provisioner ever ran: none answered a knock either.
		out := map[string][]audit.SourceProblem{}
		if node != "" {
			un, err := r.unanswered(ctx, nil, map[string]uint64{node: 0}, time.Now())
			if err != nil {
				return nil, err
			}
			if p, ok := un[node]; ok {
				out[node] = []audit.SourceProblem{p}
			}
		}
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	sts, err := store.ReadFillStatus(ctx, kv, node)
	if err != nil {
		return nil, fmt.Errorf("fill statuses: %w", err)
	}
	out := map[string][]audit.SourceProblem{}
	for _, st := range sts {
		out[st.Node] = append(out[st.Node], audit.SourceProblem{Module: st.Module, Path: st.Path, State: string(st.State),
			Why: st.Why, Since: st.Since, Signer: st.Signer, LastFilled: st.LastFilled})
	}
	if node != "" {
		un, err := r.unanswered(ctx, kv, map[string]uint64{node: 0}, time.Now())
		if err != nil {
			return nil, err
		}
		if p, ok := un[node]; ok {
			out[node] = audit.AddUnanswered(out[node], p)
		}
	}
	return out, nil
}

// Unanswered returns, of nodes (each node's newest knock's cause as the
// caller's view of it holds it, 0 when unknown), those whose newest knock
// no provisioner answered within audit.KnockGrace of now, each with its
// audit.NoProvisioner problem (audit.KnockUnanswered), unless its newest
// plan declares no file ([PlanDeclaresFiles]: no provisioner is needed
// there, though a poke knocks it too). A node whose
// provisioner's answer (store.KnockAnswer, in the fill status bucket)
// covers that cause is answered without a read; the others' newest knock
// is read from the stream (a direct get each, up to [unansweredGets];
// past them, one pass over every node's newest knock and one over every
// node's newest plan: none is left out). The answers are read a get each for up to
// [unansweredGets] nodes, beyond in one pass over the bucket's answers
// (one a node that ever ran a provisioner). [Reader.Sources] of one node includes its problem;
// `meshfold fleet` asks for the nodes whose rows name a knock.
//
// Errors: the stream's lookup; the bucket's read; a get's, other than
// for no knock.
func (r *Reader) Unanswered(ctx context.Context, nodes map[string]uint64, now time.Time) (map[string]audit.SourceProblem, error) {
	_, cfg, err := r.open(ctx)
	if err != nil {
		return nil, err
	}
	kv, err := store.OpenFillStatus(ctx, r.js, cfg, false)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv = nil
	} else if err != nil {
		return nil, err
	}
	return r.unanswered(ctx, kv, nodes, now)
}

// unansweredGets bounds the knocks [Reader.Unanswered] and a
// [KnockCheck] read a get each; past it, they read every node's newest
// knock and plan in one pass each.
const unansweredGets = 200

func (r *Reader) unanswered(ctx context.Context, kv jetstream.KeyValue, nodes map[string]uint64, now time.Time) (map[string]audit.SourceProblem, error) {
	out := map[string]audit.SourceProblem{}
	if len(nodes) == 0 {
		return out, nil
	}
	answers := map[string]store.KnockAnswer{}
	switch {
	case kv == nil:
	case len(nodes) <= unansweredGets:
		// A get each: a fleet's answers are one a node.
		for n := range nodes {
			a, ok, err := store.GetKnockAnswer(ctx, kv, n)
			if err != nil {
				return nil, fmt.Errorf("node %s: knock answer: %w", n, err)
			}
			if ok {
				answers[n] = a
			}
		}
	default:
		var err error
		if answers, err = store.ReadKnockAnswers(ctx, kv, ""); err != nil {
			return nil, fmt.Errorf("knock answers: %w", err)
		}
	}
	k, err := r.knockCheck(ctx, answers, now)
	if err != nil {
		return nil, err
	}
	for n, cause := range nodes {
		p, ok, err := k.Check(ctx, n, cause)
		if err != nil {
			return nil, err
		}
		if ok {
			out[n] = p
		}
	}
	return out, nil
}

// KnockCheck tells, node by node, whether a node's newest knock went
// unanswered (audit.KnockUnanswered) against the provisioners' answers
// read once ([Reader.KnockCheck]): the rule `fleet`'s table applies,
// for readers that make their rows one at a time (`fleet -o json`'s
// streamed lines). Safe for concurrent use.
type KnockCheck struct {
	r       *Reader
	answers map[string]store.KnockAnswer
	now     time.Time
	gets    atomic.Int64
	// pass is every node's newest knock and whether its newest plan
	// declares a file, read once past the first [unansweredGets] gets.
	passOnce sync.Once
	pass     *knockPass
	passErr  error
}

// knockPass is every node's newest knock (its sequence, cause and stored
// time) and whether its newest plan declares a file, read in one pass
// over each kind's newest events (store.LastPerSubjectAt): what a
// [KnockCheck] answers from once it has made [unansweredGets] gets, so
// that a fleet of any size has every unanswered knock said (a fresh
// user's finding: past 200, `meshfold fleet` dropped them silently).
type knockPass struct {
	knocks map[string]passKnock
	files  map[string]passPlan
}

type passKnock struct {
	seq, cause uint64
	at         time.Time
}

type passPlan struct {
	seq   uint64
	files bool
}

// readKnockPass reads k's pass: memory one entry a node that was ever
// knocked or planned, the messages in batches (no more than
// store.LastPerSubject asks for at a time).
func (k *KnockCheck) readKnockPass(ctx context.Context) (*knockPass, error) {
	k.passOnce.Do(func() {
		_, cfg, err := k.r.open(ctx)
		if err != nil {
			k.passErr = err
			return
		}
		subj := cfg.Subjects()
		p := &knockPass{knocks: map[string]passKnock{}, files: map[string]passPlan{}}
		if err := store.LastPerSubjectAt(ctx, k.r.js, cfg.Name, subj.StoredKind(events.KindKnock), func(subject string, seq uint64, t time.Time, data []byte) error {
			ev, err := subj.DecodeEvent(subject, data, seq, t)
			if err != nil {
				return nil // not a node's subject
			}
			kn, ok := ev.Payload.(*events.Knock)
			if !ok || seq < p.knocks[ev.Node].seq {
				return nil
			}
			p.knocks[ev.Node] = passKnock{seq: seq, cause: kn.Cause, at: t}
			return nil
		}); err != nil {
			k.passErr = fmt.Errorf("every node's newest knock: %w", err)
			return
		}
		if err := store.LastPerSubjectAt(ctx, k.r.js, cfg.Name, subj.StoredKind(events.KindPlan), func(subject string, seq uint64, t time.Time, data []byte) error {
			ev, err := subj.DecodeEvent(subject, data, seq, t)
			if err != nil || seq < p.files[ev.Node].seq {
				return nil
			}
			pl, ok := ev.Payload.(*events.Plan)
			p.files[ev.Node] = passPlan{seq: seq, files: ok && events.DeclaresFiles(pl.Modules)}
			return nil
		}); err != nil {
			k.passErr = fmt.Errorf("every node's newest plan: %w", err)
			return
		}
		k.pass = p
	})
	return k.pass, k.passErr
}

// KnockCheck reads every provisioner's answer (one pass over the fill
// status bucket's answers; none when the bucket does not exist yet) and
// returns the check of knocks at now.
//
// Errors: the stream's lookup; the bucket's read.
func (r *Reader) KnockCheck(ctx context.Context, now time.Time) (*KnockCheck, error) {
	_, cfg, err := r.open(ctx)
	if err != nil {
		return nil, err
	}
	answers := map[string]store.KnockAnswer{}
	kv, err := store.OpenFillStatus(ctx, r.js, cfg, false)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
	case err != nil:
		return nil, err
	default:
		if answers, err = store.ReadKnockAnswers(ctx, kv, ""); err != nil {
			return nil, fmt.Errorf("knock answers: %w", err)
		}
	}
	return r.knockCheck(ctx, answers, now)
}

func (r *Reader) knockCheck(ctx context.Context, answers map[string]store.KnockAnswer, now time.Time) (*KnockCheck, error) {
	if _, _, err := r.open(ctx); err != nil {
		return nil, err
	}
	return &KnockCheck{r: r, answers: answers, now: now}, nil
}

// Check returns node's audit.NoProvisioner problem when its newest knock
// (caused by cause, the sequence its view holds; 0 when unknown) is
// unanswered: a node whose provisioner's answer covers cause is answered
// without a read; the others' newest knock is read from the stream (a
// direct get each for the first [unansweredGets] of k's checks; past
// them, every node's newest knock and plan are read once, in one pass
// each, and the checks answered from them). A node with no knock has no
// problem, nor has one whose newest plan declares no file
// ([PlanDeclaresFiles], a get more).
//
// Errors: a get's, other than for no knock; the pass's.
func (k *KnockCheck) Check(ctx context.Context, node string, cause uint64) (p audit.SourceProblem, ok bool, err error) {
	a, answered := k.answers[node]
	if answered && cause != 0 && a.Cause >= cause {
		return p, false, nil
	}
	var ans *audit.KnockAnswer
	if answered {
		ans = &audit.KnockAnswer{Knock: a.Knock, At: a.At, Account: a.Account}
	}
	if k.gets.Add(1) > unansweredGets {
		pass, err := k.readKnockPass(ctx)
		if err != nil {
			return p, false, err
		}
		kn, known := pass.knocks[node]
		if !known {
			return p, false, nil
		}
		p, ok = audit.KnockUnanswered(node, kn.seq, kn.cause, kn.at, ans, k.now, audit.KnockGrace)
		if !ok || !pass.files[node].files {
			return audit.SourceProblem{}, false, nil
		}
		return p, true, nil
	}
	stream, cfg, err := k.r.open(ctx)
	if err != nil {
		return p, false, err
	}
	m, err := store.LastMsg(ctx, stream, cfg.Subjects(), node, events.KindKnock)
	if errors.Is(err, store.ErrNoMessage) {
		return p, false, nil
	}
	if err != nil {
		return p, false, fmt.Errorf("node %s: newest knock: %w", node, err)
	}
	kn, isKnock := m.Event.Payload.(*events.Knock)
	if !isKnock {
		return p, false, nil
	}
	p, ok = audit.KnockUnanswered(node, m.Event.Seq, kn.Cause, m.Event.Time, ans, k.now, audit.KnockGrace)
	if !ok {
		return p, false, nil
	}
	// A node whose plan declares no file needs no provisioner: a poke
	// knocks it all the same (the fold knocks on every poke), and nobody
	// is there to answer (reviewer's finding).
	files, err := PlanDeclaresFiles(ctx, stream, cfg.Subjects(), node)
	if err != nil {
		return audit.SourceProblem{}, false, err
	}
	if !files {
		return audit.SourceProblem{}, false, nil
	}
	return p, true, nil
}

// PlanDeclaresFiles reports whether node's newest plan declares a file
// for a provisioner to fill (a module with files): one direct get. A node
// with no plan declares none.
//
// Errors: the get's, other than for no plan.
func PlanDeclaresFiles(ctx context.Context, stream store.LastGetter, subj events.Subjects, node string) (bool, error) {
	m, err := store.LastMsg(ctx, stream, subj, node, events.KindPlan)
	if errors.Is(err, store.ErrNoMessage) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("node %s: newest plan: %w", node, err)
	}
	p, ok := m.Event.Payload.(*events.Plan)
	return ok && events.DeclaresFiles(p.Modules), nil
}
