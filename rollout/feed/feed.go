package feed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/fleetfile"
	"github.com/meshfold/meshfold/store"
)

// ErrNoRollout: the stream holds no rollout start of the fleet.
var ErrNoRollout = errors.New("feed: no rollout of this fleet")

// Message is one stored message as the fold needs it.
type Message struct {
	Subject string
	Header  nats.Header
	Data    []byte
	Seq     uint64
	Time    time.Time
}

// Input returns the fold's input of a stored message for fleet's state s
// (a node's agent event is its down or up moment), and false for a
// message the fleet's rollout does not read: another
// fleet's rollout event, an event of a node s's rollout does not name,
// or a kind the fold does not read. With own set, a plan that does not
// verify against own (folded as foreign by the reconciler) is given with
// [rollout.Input.Unverified] saying why: the fold never takes it as the
// node's plan, and a rollout in progress pauses on it.
func Input(subj events.Subjects, s *rollout.State, own *store.Trust, m Message) (rollout.Input, bool) {
	if fleet, k, by, ok := subj.ParseRolloutBy(m.Subject); ok {
		if fleet != s.Fleet {
			return rollout.Input{}, false
		}
		// A named operator's verb: taken only as the operator its
		// subject names (rollout.FromNamedRolloutEvent).
		return rollout.FromNamedRolloutEvent(rollout.Kind(k), m.Data, m.Seq, m.Time, by), true
	}
	r := s.Rollout
	if r == nil {
		return rollout.Input{}, false
	}
	node, kind, err := subj.Parse(m.Subject)
	if err != nil {
		return rollout.Input{}, false
	}
	switch kind {
	case events.KindWant, events.KindPlan, events.KindSettle, events.KindHave, events.KindAgent, events.KindPause, events.KindResume, events.KindRetire,
		events.KindFilled, events.KindProv:
	default:
		return rollout.Input{}, false
	}
	if _, ok := r.Nodes[node]; !ok {
		return rollout.Input{}, false
	}
	var unverified error
	if kind == events.KindPlan && own != nil {
		unverified = own.Verify(node, kind, m.Header, m.Data)
	}
	ev, err := subj.DecodeEvent(m.Subject, m.Data, m.Seq, m.Time)
	if err != nil {
		return rollout.Input{}, false
	}
	if unverified != nil {
		// Folded as foreign by the reconciler; the rollout holds it
		// aside and pauses on it (rollout.Input.Unverified).
		in, ok := rollout.FromNodeEvent(ev)
		in.Unverified = unverified.Error()
		return in, ok
	}
	if a, ok := ev.Payload.(*events.Agent); ok {
		// The agent's liveness (DESIGN.md §11): its down and up moments.
		in := rollout.Input{Seq: ev.Seq, Time: ev.Time, Node: ev.Node, Kind: rollout.KindUp}
		if a.State == events.AgentDown {
			in.Kind = rollout.KindDown
		}
		return in, true
	}
	in, ok := rollout.FromNodeEvent(ev)
	if ok && in.Kind == rollout.KindWant {
		// A rollout step's want names the rollout (rollout.Input.ID).
		in.ID = m.Header.Get(jetstream.MsgIDHeader)
	}
	return in, ok
}

// FromTailed is the [Message] of a tailed message.
func FromTailed(x store.Tailed) Message {
	return Message{Subject: x.Msg.Subject(), Header: x.Msg.Headers(), Data: x.Msg.Data(),
		Seq: x.Meta.Sequence.Stream, Time: x.Meta.Timestamp}
}

// NewestStart returns the sequence of fleet's newest rollout start.
//
// Errors: [ErrNoRollout]; the stream's.
func NewestStart(ctx context.Context, stream jetstream.Stream, subj events.Subjects, fleet string) (uint64, error) {
	m, err := stream.GetLastMsgForSubject(ctx, subj.Rollout(fleet, string(rollout.KindStart)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, fmt.Errorf("%w %s", ErrNoRollout, fleet)
	}
	if err != nil {
		return 0, fmt.Errorf("newest start of %s: %w", fleet, err)
	}
	return m.Sequence, nil
}

// Replay folds fleet's rollout from its newest start to the stream's end
// as it is now, and returns the state (the effects are dropped: this is
// a read), with the newest have from before the start of each node that
// reported none since, for the delivery view's builds. own: as [Input].
//
// Errors: [ErrNoRollout]; the stream's and the read's; ctx's.
func Replay(ctx context.Context, js jetstream.JetStream, cfg store.StreamConfig, own *store.Trust, fleet string) (*rollout.State, error) {
	cfg = cfg.WithDefaults()
	subj := cfg.Subjects()
	// Each request before the read rides out a stream electing a leader
	// (store.RideOut, 30 s when ctx has no deadline): a rollout verb or
	// status right after a kill -9 of the stream's leader failed at 10 s
	// or, creating the consumer with no deadline, could wait for ever (a
	// fresh user's findings V2, V3).
	stream, err := store.RideOut(ctx, cfg.Name, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, cfg.Name) })
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", cfg.Name, err)
	}
	start, err := store.RideOut(ctx, cfg.Name, func(ctx context.Context) (uint64, error) { return NewestStart(ctx, stream, subj, fleet) })
	if err != nil {
		return nil, err
	}
	end, err := store.RideOut(ctx, cfg.Name, func(ctx context.Context) (uint64, error) { return store.StreamLastSeq(ctx, stream) })
	if err != nil {
		return nil, err
	}
	s := rollout.NewState(fleet)
	// The consumer's creation, answered by the meta leader only, asked
	// one attempt at a time (1 s doubling to 5 s: not a fresh ask every
	// 2 s that a merely slow server answers late, each leaving a consumer
	// behind), as every one-shot read's is.
	tail, err := store.FollowRidingOut(ctx, js, store.TailConfig{Stream: cfg.Name, Subjects: subj, Start: start})
	if err != nil {
		return nil, err
	}
	defer tail.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case x := <-tail.C():
			if x.Err != nil {
				return nil, x.Err
			}
			m := FromTailed(x)
			if in, ok := Input(subj, s, own, m); ok {
				s.Fold(in)
			}
			if m.Seq >= end {
				if err := earlierHaves(ctx, stream, subj, s); err != nil {
					return nil, err
				}
				if err := movedBy(ctx, stream, subj, s); err != nil {
					return nil, err
				}
				return s, nil
			}
		}
	}
}

// earlierHaves gives each of the rollout's nodes no have of which was
// folded its newest have from before the start (rollout.State.SetEarlierHave),
// so that the delivery view counts the builds of every node, not only of
// those that reported since the start. One read per such node.
func earlierHaves(ctx context.Context, stream jetstream.Stream, subj events.Subjects, s *rollout.State) error {
	r := s.Rollout
	if r == nil {
		return nil
	}
	for _, name := range slices.Sorted(maps.Keys(r.Nodes)) {
		if r.Nodes[name].Have != nil {
			continue
		}
		m, err := store.LastMsg(ctx, stream, subj, name, events.KindHave)
		if errors.Is(err, store.ErrNoMessage) {
			continue
		}
		if err != nil {
			return fmt.Errorf("newest have of %s: %w", name, err)
		}
		if h, ok := m.Event.Payload.(*events.Have); ok {
			s.SetEarlierHave(name, m.Event.Seq, m.Event.Time, rollout.HaveOf(h))
		}
	}
	return nil
}

// movedBy gives each node another fleet's rollout took over
// (rollout.Node.Moved) who applied that take-over, read from that
// rollout's start (its id is the start's sequence): the delivery view
// says "moved to fleet api (rollout 535, --take-over by alice at #535)".
// A start that is gone (--max-age) or unreadable leaves it unsaid. One
// read per such node.
func movedBy(ctx context.Context, stream jetstream.Stream, subj events.Subjects, s *rollout.State) error {
	r := s.Rollout
	if r == nil {
		return nil
	}
	for _, name := range slices.Sorted(maps.Keys(r.Nodes)) {
		mv := r.Nodes[name].Moved
		if mv == nil {
			continue
		}
		m, err := stream.GetMsg(ctx, mv.Rollout, jetstream.WithGetMsgSubject(subj.Rollout(mv.Fleet, string(rollout.KindStart))))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("fleet %s's rollout %d, which took %s over: %w", mv.Fleet, mv.Rollout, name, err)
		}
		var st rollout.Start
		if m.Sequence == mv.Rollout && json.Unmarshal(m.Data, &st) == nil && st.By != "" {
			s.SetMovedBy(name, st.By)
		}
	}
	return nil
}

// Fleets returns the fleets the stream holds a rollout start of, sorted.
//
// Errors: the stream info's.
func Fleets(ctx context.Context, stream jetstream.Stream, subj events.Subjects) ([]string, error) {
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subj.Rollout("*", string(rollout.KindStart))))
	if err != nil {
		return nil, fmt.Errorf("stream info: %w", err)
	}
	var out []string
	for s := range info.State.Subjects {
		if f, _, ok := subj.ParseRollout(s); ok {
			out = append(out, f)
		}
	}
	slices.Sort(out)
	return out, nil
}

// FleetsWithoutStart returns the fleets the stream holds rollout events
// of (records, outcomes, ticks, verbs) but no start, sorted: with the
// stream's limits (--max-age, --max-bytes) shorter than a rollout, its
// start leaves the stream before the events that follow it. One stream
// info over every fleet's rollout subjects (a fleet has at most one per
// kind).
//
// Errors: the stream info's.
func FleetsWithoutStart(ctx context.Context, stream jetstream.Stream, subj events.Subjects) ([]string, error) {
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subj.RolloutInput()))
	if err != nil {
		return nil, fmt.Errorf("stream info: %w", err)
	}
	started := map[string]bool{}
	for s := range info.State.Subjects {
		if f, k, ok := subj.ParseRollout(s); ok {
			started[f] = started[f] || rollout.Kind(k) == rollout.KindStart
		}
	}
	var out []string
	for f, ok := range started {
		if !ok {
			out = append(out, f)
		}
	}
	slices.Sort(out)
	return out, nil
}

// HeldWant returns the newest want the reconciler's state holds of node:
// its sequence and modules (seq 0: the state holds none, the node never
// had a want). [Candidates] asks it for a node whose want subject holds
// none: its want may have aged out of the stream (--max-age), while the
// reconciler's state (or snapshot) still rests on it. An error means it
// could not be told.
type HeldWant func(ctx context.Context, node string) (seq uint64, modules []events.WantModule, err error)

// Candidates reads, for each node fleet owns, its newest want, whether
// its newest agent event says down, whether it is paused, and its newest
// have's unhealthy modules, and pairs them with the fleet file's
// want: what [rollout.NewStart] starts a rollout from.
//
// Errors: the stream's reads.
func Candidates(ctx context.Context, stream jetstream.Stream, subj events.Subjects, fleet *fleetfile.Fleet) ([]rollout.Candidate, error) {
	return CandidatesHeld(ctx, stream, subj, fleet, nil)
}

// CandidatesHeld is [Candidates] asking held, when not nil, for the want
// of each node whose want subject holds none: a want it returns is the
// candidate's current want, which the start carries for a revert
// (rollout.Candidate.HadSeq; a fresh user's finding F0: such a node was
// taken as new, and auto_revert gave it an empty want).
//
// The nodes' reads (five to seven direct gets a node) are made
// [candidateReads] nodes at a time; held is asked after them, as many
// at a time (atOnce). The first read that fails ends the others.
//
// Errors: a [*ReadError] naming the node and the read that failed first;
// held's, naming the node.
func CandidatesHeld(ctx context.Context, stream jetstream.Stream, subj events.Subjects, fleet *fleetfile.Fleet, held HeldWant) ([]rollout.Candidate, error) {
	out := make([]rollout.Candidate, len(fleet.Nodes))
	reads := make([]nodeRead, len(fleet.Nodes))
	every := make([]int, len(fleet.Nodes))
	for i := range every {
		every[i] = i
	}
	err := atOnce(ctx, every, func(ctx context.Context, i int) (err error) {
		out[i], reads[i], err = candidate(ctx, stream, subj, fleet, fleet.Nodes[i].Name)
		return err
	})
	if err != nil {
		return nil, err
	}
	if held == nil {
		return out, nil
	}
	// The held wants of the nodes whose want subject holds none, as many
	// at a time (a fresh user's finding: an apply of 185 nodes new to a
	// reconciler group asked them one after another, each waiting for
	// its answer, and ran out of its --timeout).
	var noWant []int
	for i := range out {
		if reads[i].noWant {
			noWant = append(noWant, i)
		}
	}
	err = atOnce(ctx, noWant, func(ctx context.Context, i int) error {
		c := &out[i]
		seq, modules, err := held(ctx, c.Node)
		if err != nil {
			return fmt.Errorf("node %s: %w", c.Node, err)
		}
		if seq != 0 {
			if modules == nil {
				modules = []events.WantModule{}
			}
			c.HadSeq, c.Had, c.Current = seq, modules, modules
			// A retire newer than the want the state holds: retired or
			// retiring, as below for a want the stream holds.
			c.Retired = reads[i].retired > seq
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// atOnce calls fn for each index of idx, [candidateReads] at a time, and
// returns the first error: it cancels the context the others run under,
// so that they fail at once (every index is still handed out), or ctx's
// error when it ended first.
func atOnce(ctx context.Context, idx []int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	next := make(chan int)
	for range min(candidateReads, len(idx)) {
		wg.Go(func() {
			for i := range next {
				if err := fn(ctx, i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					cancel()
				}
			}
		})
	}
	for _, i := range idx {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// candidateReads is how many nodes [CandidatesHeld] reads at once: a
// fleet of 60 nodes was read one request at a time, some 400 round trips
// in a row, which on a loaded cluster (load 44 on 2 cores) took 2.9–14.4
// s of apply's --timeout (a fresh user's finding G0). Eight keeps the
// servers' direct-get queue short while the round trips overlap.
const candidateReads = 8

// ReadError is a read of one node's newest events that failed: what
// [CandidatesHeld] returns, so that apply can say which node and which
// read ended it.
type ReadError struct {
	Node string // the node whose event was read
	What string // the read: "newest want", "newest have", …
	Err  error  // the read's error (store.LastMsg's)
}

func (e *ReadError) Error() string {
	return fmt.Sprintf("reading node %s's %s: %v", e.Node, e.What, e.Err)
}

func (e *ReadError) Unwrap() error { return e.Err }

// nodeRead is what [candidate] read that the candidate does not keep.
type nodeRead struct {
	noWant  bool   // the node's want subject holds no want (held is asked)
	retired uint64 // the sequence of its newest retire, 0 for none
}

// leaderWants is a stream whose nodes' newest wants [Candidates] reads
// from the stream's leader ([WithLeaderWants]).
type leaderWants struct {
	jetstream.Stream
	leader store.LastGetter
}

// WithLeaderWants returns stream for [Candidates] and [NewPlan] to read
// each node's newest want from the stream's leader (store.Leader, over
// js), its other events with a direct get as before. The want read is
// the step's expectation (Candidate.Prev): a direct get may be answered
// by a replica that has not yet applied a want stored a moment before
// (a superseding apply right after another, a want by hand), and the
// controller's step, expecting the older one, is then refused as a
// conflict, which fails the target and, with auto_revert, reverts a
// healthy fleet (flakes3's finding under load). `meshfold apply` reads
// so.
func WithLeaderWants(stream jetstream.Stream, js jetstream.JetStream) jetstream.Stream {
	return leaderWants{Stream: stream, leader: store.Leader(js, stream.CachedInfo().Config.Name)}
}

// candidate reads node's newest want, agent event, pause, retire and
// have, and pairs them with the fleet file's want.
func candidate(ctx context.Context, stream jetstream.Stream, subj events.Subjects, fleet *fleetfile.Fleet, node string) (c rollout.Candidate, r nodeRead, err error) {
	want, _ := fleet.Want(node)
	c = rollout.Candidate{Node: node, Want: want}
	last := func(k events.Kind) (store.Msg, bool, error) {
		var from store.LastGetter = stream
		if lw, ok := stream.(leaderWants); ok && k == events.KindWant {
			from = lw.leader
		}
		m, err := store.LastMsg(ctx, from, subj, node, k)
		switch {
		case errors.Is(err, store.ErrNoMessage):
			return store.Msg{}, false, nil
		case err != nil:
			return store.Msg{}, false, &ReadError{Node: node, What: "newest " + string(k), Err: err}
		}
		return m, true, nil
	}
	m, ok, err := last(events.KindWant)
	switch {
	case err != nil:
		return c, r, err
	case !ok:
		r.noWant = true
	default:
		c.Prev = m.Event.Seq
		if w, ok := m.Event.Payload.(*events.Want); ok {
			c.Current = w.Modules
		}
	}
	a, ok, err := last(events.KindAgent)
	if err != nil {
		return c, r, err
	}
	if ag, is := a.Event.Payload.(*events.Agent); ok && is {
		c.Down = ag.State == events.AgentDown
		if c.Down {
			c.DownSince = a.Event.Time
		} else {
			c.Trusts = ag.Trusts
		}
	}
	p, ok, err := last(events.KindPlan)
	if err != nil {
		return c, r, err
	}
	if ok {
		c.PlanSigner, c.PlanSeq = p.Signer, p.Event.Seq
	}
	if err := pausedAtStart(ctx, stream, subj, &c); err != nil {
		return c, r, &ReadError{Node: node, What: "newest pause", Err: err}
	}
	rt, ok, err := last(events.KindRetire)
	if err != nil {
		return c, r, err
	}
	if ok {
		// A retire newer than the newest want: retired or retiring,
		// until a want brings it back.
		r.retired = rt.Event.Seq
		c.Retired = rt.Event.Seq > c.Prev
	}
	h, ok, err := last(events.KindHave)
	if err != nil {
		return c, r, err
	}
	if have, is := h.Event.Payload.(*events.Have); ok && is {
		for _, hm := range have.Modules {
			if hm.Health == events.Unhealthy || hm.State == events.Failed {
				c.Unhealthy = append(c.Unhealthy, hm.Name)
			}
		}
		c.Restarts = rollout.RestartsOf(rollout.HaveOf(have).Modules)
	}
	return c, r, nil
}

// pausedAtStart sets c's pause ([Paused]).
func pausedAtStart(ctx context.Context, stream jetstream.Stream, subj events.Subjects, c *rollout.Candidate) error {
	p, _, err := Paused(ctx, stream, subj, c.Node)
	if err != nil {
		return err
	}
	if p != nil {
		c.PausedBy, c.PausedReason = p.By, p.Reason
	}
	return nil
}

// Paused returns the pause of node in force by the stream as it is now,
// and its sequence: its newest pause when newer than its newest resume
// and its newest retire (the reconciler's fold: a resume ends a pause, a
// retire ends it too, a second pause keeps the first, which this
// returns the newest of); nil when the node is not paused.
//
// Errors: the stream's reads.
func Paused(ctx context.Context, stream jetstream.Stream, subj events.Subjects, node string) (*events.Pause, uint64, error) {
	p, err := store.LastMsg(ctx, stream, subj, node, events.KindPause)
	switch {
	case errors.Is(err, store.ErrNoMessage):
		return nil, 0, nil
	case err != nil:
		return nil, 0, err
	}
	for _, k := range []events.Kind{events.KindResume, events.KindRetire} {
		m, err := store.LastMsg(ctx, stream, subj, node, k)
		switch {
		case errors.Is(err, store.ErrNoMessage):
		case err != nil:
			return nil, 0, err
		case m.Event.Seq > p.Event.Seq:
			return nil, 0, nil
		}
	}
	pa, ok := p.Event.Payload.(*events.Pause)
	if !ok {
		return nil, 0, nil
	}
	return pa, p.Event.Seq, nil
}

// Publish appends a rollout event of fleet, of kind k, under message id
// id (none when empty), stamped now, and returns its sequence. The
// payload is validated first.
//
// Errors: a validation error (matching events.ErrInvalid); the
// publish's (store.ServerError).
func Publish(ctx context.Context, js jetstream.JetStream, subj events.Subjects, fleet string, k rollout.Kind, p any, id string) (uint64, error) {
	return publish(ctx, js, subj, fleet, k, p, id)
}

// PublishNamed is [Publish] of a named operator's verb, on the subject
// that ends in its name (events.Subjects.NamedRollout, op.By being the
// name): the only rollout verb subject such creds of this build may
// publish on, so the name is one the server checked. The stream stores
// it once an operator asked (store.CapturesNamedRollouts); before, the
// publish finds no stream.
//
// Errors: as [Publish].
func PublishNamed(ctx context.Context, js jetstream.JetStream, subj events.Subjects, fleet string, op *rollout.Operator, id string) (uint64, error) {
	return publishOn(ctx, js, subj.NamedRollout(fleet, string(op.Kind()), op.By), fleet, op.Kind(), op, id)
}

// publish is [Publish] with more of the client's options (a fence).
func publish(ctx context.Context, js jetstream.JetStream, subj events.Subjects, fleet string, k rollout.Kind, p any, id string, more ...jetstream.PublishOpt) (uint64, error) {
	return publishOn(ctx, js, subj.Rollout(fleet, string(k)), fleet, k, p, id, more...)
}

// publishOn is publish on subject.
func publishOn(ctx context.Context, js jetstream.JetStream, subject, fleet string, k rollout.Kind, p any, id string, more ...jetstream.PublishOpt) (uint64, error) {
	rollout.Stamp(p, time.Now())
	if v, ok := p.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return 0, fmt.Errorf("rollout %s: %w", k, err)
		}
	}
	data, err := json.Marshal(p)
	if err != nil {
		return 0, err
	}
	opts := more
	if id != "" {
		opts = append(opts, jetstream.WithMsgID(id))
	}
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data}, opts...)
	if err != nil {
		return 0, fmt.Errorf("publish rollout %s of %s: %w", k, fleet, store.ServerError(err))
	}
	return ack.Sequence, nil
}

// Plan is what apply computed: the start (nil when no node's want
// changes) and its pages.
type Plan struct {
	Fleet *fleetfile.Fleet
	Cands []rollout.Candidate
	Start *rollout.Start
	Pages [][]rollout.NodeAtStart
	// After is the stream sequence of the fleet's newest start when the
	// plan was read, before its wants (0: the fleet had none). [Plan.Apply]
	// publishes the start only while it is still the newest
	// ([ErrStartedMeanwhile]).
	After uint64
}

// ErrStartedMeanwhile is [Plan.Apply]'s error when another start of the
// fleet was stored after the plan read the fleet: the plan diffed its
// targets against wants that rollout may be changing, and a start
// published over it would halt at its first step on a conflict that no
// one made by hand (a fresh user's finding G2: two operators' applies at
// once both said "started"; the second halted, auto-reverted, and the
// fleet was left mixed). Nothing was published; apply again reads the
// newer rollout.
var ErrStartedMeanwhile = errors.New("feed: another rollout of the fleet started after the plan read it")

// StartedMeanwhileError is [ErrStartedMeanwhile] with what was read.
type StartedMeanwhileError struct {
	Fleet string
	After uint64 // the newest start the plan read (0: none)
	Err   error  // the server's refusal
}

func (e *StartedMeanwhileError) Error() string {
	read := "no rollout"
	if e.After > 0 {
		read = fmt.Sprintf("rollout %d as its newest", e.After)
	}
	return fmt.Sprintf("another rollout of fleet %s started after this apply read the fleet (it read %s): nothing was published; "+
		"'meshfold rollout status %s' shows it, and apply again diffs against the wants it gives", e.Fleet, read, e.Fleet)
}

func (e *StartedMeanwhileError) Unwrap() []error { return []error{ErrStartedMeanwhile, e.Err} }

// NewPlan computes apply's start for fleet, reading the nodes' newest
// wants and haves.
func NewPlan(ctx context.Context, stream jetstream.Stream, subj events.Subjects, fleet *fleetfile.Fleet, by, reason string) (*Plan, error) {
	return NewPlanHeld(ctx, stream, subj, fleet, by, reason, nil)
}

// NewPlanHeld is [NewPlan] asking held for the wants the stream no
// longer holds ([CandidatesHeld]).
//
// The fleet's newest start is read first (Plan.After): a start stored
// after it, whose steps the wants read may or may not show, refuses the
// plan's own ([ErrStartedMeanwhile]).
func NewPlanHeld(ctx context.Context, stream jetstream.Stream, subj events.Subjects, fleet *fleetfile.Fleet, by, reason string, held HeldWant) (*Plan, error) {
	after, err := NewestStart(ctx, stream, subj, fleet.Name)
	if errors.Is(err, ErrNoRollout) {
		after, err = 0, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading fleet %s's newest rollout: %w", fleet.Name, err)
	}
	cands, err := CandidatesHeld(ctx, stream, subj, fleet, held)
	if err != nil {
		return nil, err
	}
	start, pages := rollout.NewStart(by, reason, fleet.Rollout, cands)
	return &Plan{Fleet: fleet, Cands: cands, Start: start, Pages: pages, After: after}, nil
}

// Over gives the plan's targets the revert bases that prior, the fleet's
// newest rollout as it stands now, knows when the plan's start would
// supersede it ([rollout.State.RevertBases]: a target whose newest want
// is prior's unfinished step gets back, on a revert, the want before
// it), and builds the start again. A nil prior, or a plan with nothing
// to start, is left as it is.
func (p *Plan) Over(prior *rollout.State) {
	if p.Start == nil || prior == nil {
		return
	}
	prior.RevertBases(p.Cands)
	p.Start, p.Pages = rollout.NewStart(p.Start.By, p.Start.Reason, p.Start.Params, p.Cands)
}

// Active returns fleet's newest rollout, replayed ([Replay]), when a new
// start would supersede it (it has not ended); nil when the fleet has no
// rollout, or when the controller's newest record on the fleet's subject
// says the newest rollout ended (completed, aborted, reverted, or
// superseded): then no replay is read, which for a rollout that ended
// long ago would read the stream since its start.
//
// Errors: the stream's and the replay's.
func Active(ctx context.Context, js jetstream.JetStream, cfg store.StreamConfig, fleet string) (*rollout.State, error) {
	cfg = cfg.WithDefaults()
	subj := cfg.Subjects()
	stream, err := js.Stream(ctx, cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", cfg.Name, err)
	}
	start, err := NewestStart(ctx, stream, subj, fleet)
	if errors.Is(err, ErrNoRollout) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	m, err := stream.GetLastMsgForSubject(ctx, subj.Rollout(fleet, string(rollout.KindRecord)))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return nil, fmt.Errorf("newest record of %s: %w", fleet, err)
	case m.Sequence > start:
		if p, err := rollout.Decode(rollout.KindRecord, m.Data); err == nil {
			if rec := p.(*rollout.Record); rec.Rollout == start && rollout.Phase(rec.What).Final() {
				return nil, nil
			}
		}
	}
	s, err := Replay(ctx, js, cfg, nil, fleet)
	if errors.Is(err, ErrNoRollout) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if s.Rollout == nil || s.Rollout.Phase.Final() {
		return nil, nil
	}
	return s, nil
}

// Apply publishes the plan's start and then its pages, and returns the
// start's sequence: the rollout's id. The start is published only while
// the fleet's newest start is still the one the plan read (Plan.After).
//
// Errors: a plan with no start (nothing to change); a
// [*StartedMeanwhileError] (matching [ErrStartedMeanwhile]) when another
// start was stored since, nothing published; the publishes'.
func (p *Plan) Apply(ctx context.Context, js jetstream.JetStream, subj events.Subjects) (uint64, error) {
	if p.Start == nil {
		return 0, errors.New("apply: no node's want changes")
	}
	// The rollout it supersedes knowingly: a want that rollout stores
	// on a target after this plan read the target is no hand change
	// (rollout.Start.Supersedes).
	p.Start.Supersedes = p.After
	id, err := publish(ctx, js, subj, p.Fleet.Name, rollout.KindStart, p.Start, "", jetstream.WithExpectLastSequencePerSubject(p.After))
	if errors.Is(store.ServerError(err), store.ErrConflict) {
		return 0, &StartedMeanwhileError{Fleet: p.Fleet.Name, After: p.After, Err: err}
	}
	if err != nil {
		return 0, err
	}
	for i, page := range p.Pages {
		np := &rollout.Nodes{Rollout: id, Page: i + 1, Nodes: page}
		if _, err := Publish(ctx, js, subj, p.Fleet.Name, rollout.KindNodes, np, fmt.Sprintf("%s.nodes.%d.%d", p.Fleet.Name, id, i+1)); err != nil {
			return id, err
		}
	}
	return id, nil
}

// Diff describes a target's want change: "web b1 → b2", "+api b1",
// "-old", and a module whose other fields change with them named
// (rollout.WantFields): "api (runs_as)", "web b1 → b2 (runs_as, files)".
func Diff(from, to []events.WantModule) string {
	var parts []string
	for _, m := range to {
		i := slices.IndexFunc(from, func(x events.WantModule) bool { return x.Name == m.Name })
		if i < 0 {
			parts = append(parts, "+"+m.Name+" "+events.Text(m.Build))
			continue
		}
		fields := rollout.WantFields(from[i], m)
		if len(fields) == 0 {
			continue
		}
		part := m.Name
		if fields[0] == "build" {
			part += " " + events.Text(from[i].Build) + " → " + events.Text(m.Build)
			fields = fields[1:]
		}
		if len(fields) > 0 {
			part += " (" + strings.Join(fields, ", ") + ")"
		}
		parts = append(parts, part)
	}
	for _, m := range from {
		if !slices.ContainsFunc(to, func(x events.WantModule) bool { return x.Name == m.Name }) {
			parts = append(parts, "-"+m.Name)
		}
	}
	if len(parts) == 0 {
		return "(order)"
	}
	return strings.Join(parts, ", ")
}

// UntrustedNote says, for `meshfold apply`, which of the plan's targets'
// agents do not trust the key the reconciler signs its plans with now:
// they refuse the plans of their new wants, and each such target fails
// the rollout (docs/operations.md, "Rotate the reconciler's key"). That
// key is the signer of the newest plan of the fleet's nodes (the
// reconciler signs every plan it publishes with its current key); a
// target's agent's keys are those its newest up listed (what it read
// when it started). "" when every target's agent trusts the key, when no
// plan names a signer (an unsigned deployment), or for targets whose
// agent's keys are unknown: an older agent's up does not list them, and
// a down agent reads its keys again when it starts.
func (p *Plan) UntrustedNote() string {
	var key, keyNode string
	var keySeq uint64
	for _, c := range p.Cands {
		if c.PlanSigner != "" && c.PlanSeq > keySeq {
			key, keyNode, keySeq = c.PlanSigner, c.Node, c.PlanSeq
		}
	}
	if key == "" {
		return ""
	}
	var refuse []string
	trusted := map[string]bool{}
	for _, c := range p.Cands {
		if !c.Target() || len(c.Trusts) == 0 || slices.Contains(c.Trusts, key) {
			continue
		}
		refuse = append(refuse, c.Node)
		for _, k := range c.Trusts {
			trusted[short(k)] = true
		}
	}
	if len(refuse) == 0 {
		return ""
	}
	slices.Sort(refuse)
	who := refuse
	if len(who) > 10 {
		who = append(slices.Clone(who[:10]), fmt.Sprintf("and %d more", len(refuse)-10))
	}
	its, does, they, each := "its agent", "does", "it trusts", "it refuses"
	if len(refuse) > 1 {
		its, does, they, each = "their agents", "do", "they trust", "each refuses"
	}
	return fmt.Sprintf("warning: %s: %s %s not trust %s, the key the reconciler signs its plans with (its newest plan, #%d of %s): "+
		"%s %s only, as read when started; %s its new plan and fails the rollout. "+
		"Put the key in the trust file (reconcilers.pub; 'meshfold auth rotate-reconciler' keeps both keys through a rotation) and restart the agent before applying",
		strings.Join(who, ", "), its, does, key, keySeq, keyNode, they, strings.Join(slices.Sorted(maps.Keys(trusted)), ", "), each)
}

// short is a key's first 8 characters and "…", as a list of keys says
// them.
func short(k string) string {
	if len(k) <= 8 {
		return k
	}
	return k[:8] + "…"
}
