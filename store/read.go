package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoMessage: the stream holds no message on that subject.
var ErrNoMessage = errors.New("store: no message")

// Msg is one stored event, decoded, with what the stream knows of it:
// what [LastMsg], [ReadNode], [Tail.Next] and [FollowNode] return.
type Msg struct {
	// Event is the decoded event, with its stream sequence (Event.Seq)
	// and time; Event.Err is set (and Payload nil) when the payload could
	// not be decoded or validated.
	Event events.Event
	// MsgID is the message's Nats-Msg-Id header, empty when it had none.
	MsgID string
	// Subject is the stored subject, with the partition token first.
	Subject string
	// Signer is the key the message says signed it (its [HeaderSigner]),
	// empty when unsigned. It proves nothing until [Trust.VerifyMsg]
	// accepted the message.
	Signer string
	// Pending is, for a message read by a follow, how many messages
	// matching its filter were stored after it when it was delivered; 0
	// for a direct get.
	Pending uint64
	// Header and Data are the message's headers and payload as stored
	// (for [Trust.VerifyMsg]).
	Header nats.Header
	Data   []byte
}

func newMsg(ev events.Event, subject string, h nats.Header, data []byte, pending uint64) Msg {
	return Msg{Event: ev, MsgID: h.Get(jetstream.MsgIDHeader), Subject: subject, Signer: h.Get(HeaderSigner),
		Pending: pending, Header: h, Data: data}
}

// StreamLeader returns the name of the server leading stream, as one
// stream info request answers it within d: "" when none answers in time,
// or the answer names none (an election; a standalone server's stream
// has no cluster). What the reconciler's and the rollout controllers'
// leader watches read.
func StreamLeader(ctx context.Context, js jetstream.JetStream, stream string, d time.Duration) string {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	s, err := js.Stream(ctx, stream) // one STREAM.INFO request: its CachedInfo is fresh
	if err != nil {
		return ""
	}
	if info := s.CachedInfo(); info != nil && info.Cluster != nil {
		return info.Cluster.Leader
	}
	return ""
}

// StreamLastSeq returns the stream's last sequence now (0 for a stream
// that never held a message), read from a fresh stream info.
func StreamLastSeq(ctx context.Context, stream jetstream.Stream) (uint64, error) {
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("stream info: %w", err)
	}
	return info.State.LastSeq, nil
}

// StreamBounds returns the stream's first and last sequences. A first
// sequence past 1 means the stream no longer holds its oldest messages
// (an age or size limit removed them).
func StreamBounds(ctx context.Context, stream jetstream.Stream) (first, last uint64, err error) {
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("stream info: %w", err)
	}
	return info.State.FirstSeq, info.State.LastSeq, nil
}

// LastMsg returns node's newest event of kind k, read from stream on its
// stored subject (subj.Stored(node, k)): with a direct get when stream
// is a jetstream.Stream, which any replica may answer, or from the
// stream's leader when it is a [LeaderReads] (a read that must see what
// was acknowledged a moment ago).
//
// An operator kind's events are also stored on named subjects
// (events.Subjects.Named), one per operator: the newest of both forms is
// returned (two gets).
//
// Errors: [ErrNoMessage] when the stream holds none; a bad node name
// (matching events.ErrInvalid); the get's error otherwise. A payload that
// fails to decode is not an error: Msg.Event.Err says why.
func LastMsg(ctx context.Context, stream LastGetter, subj events.Subjects, node string, kind events.Kind) (Msg, error) {
	if !events.ValidName(node) {
		return Msg{}, &events.FieldError{Field: "node", Value: node, Err: events.ErrBadName}
	}
	stored := subj.Stored(node, kind)
	raw, err := stream.GetLastMsgForSubject(ctx, stored)
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return Msg{}, fmt.Errorf("last message on %s: %w", stored, err)
	}
	if kind.Operator() {
		named := stored + ".*"
		n, nerr := stream.GetLastMsgForSubject(ctx, named)
		switch {
		case nerr != nil && !errors.Is(nerr, jetstream.ErrMsgNotFound):
			return Msg{}, fmt.Errorf("last message on %s: %w", named, nerr)
		case nerr == nil && (raw == nil || n.Sequence > raw.Sequence):
			raw, err = n, nil
		}
	}
	if raw == nil {
		return Msg{}, fmt.Errorf("last message on %s: %w", stored, ErrNoMessage)
	}
	ev, err := subj.DecodeEvent(raw.Subject, raw.Data, raw.Sequence, raw.Time)
	if err != nil {
		return Msg{}, fmt.Errorf("message %d: %w", raw.Sequence, err)
	}
	return newMsg(ev, raw.Subject, raw.Header, raw.Data, 0), nil
}

// ReadNode calls fn for each of node's events in stream order, from
// sequence from (0: the first) up to and including sequence to (0: open),
// and returns once it has passed the node's newest event as of the call:
// it never waits for events published later. It reads with an ordered
// consumer filtered to the node's stored subjects, so other nodes' events
// are never fetched.
//
// Errors: fn's error, returned as is and ending the read; a bad node name
// (matching events.ErrInvalid); ctx's error; the consumer's errors.
func ReadNode(ctx context.Context, js jetstream.JetStream, streamName string, subj events.Subjects, node string, from, to uint64, fn func(Msg) error) error {
	if !events.ValidName(node) {
		return &events.FieldError{Field: "node", Value: node, Err: events.ErrBadName}
	}
	return ReadFilter(ctx, js, streamName, subj, subj.StoredNode(node), node, from, to, fn)
}

// ReadFilter is [ReadNode] for any one stored-subject filter (wildcards
// allowed, e.g. Subjects.StoredKind(events.KindWant): every node's
// wants): fn is called for each message filter matches, in stream order,
// from sequence from up to and including to (0: the newest as of the
// call). what names the read in errors.
//
// Errors: as [ReadNode].
func ReadFilter(ctx context.Context, js jetstream.JetStream, streamName string, subj events.Subjects, filter, what string, from, to uint64, fn func(Msg) error) error {
	node := what
	// The node's newest event now bounds the read, so it ends without
	// waiting for messages that may never come. Read from the leader: a
	// replica behind it would end the read before an event just
	// acknowledged (an audit right after a want).
	leader := Leader(js, streamName)
	// Bounded as the consumer's creation below (FollowRidingOut): a ctx
	// without a deadline waits WithRideOut's bound, else DefaultRideOut,
	// for the leader, not the connection's 5 s timeout, shorter than an
	// election (4-10 s after a kill -9).
	lctx := ctx
	if _, ok := ctx.Deadline(); !ok {
		lctx = WithRideOut(ctx, rideOutBound(ctx, DefaultRideOut))
	}
	last, err := leader.GetLastMsgForSubject(lctx, filter)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: last message: %w", node, err)
	}
	end := last.Sequence
	if to != 0 && to < end {
		end = to
	}
	if from > end {
		return nil
	}
	// The consumer may be placed on a replica behind the leader: its
	// count of pending messages then ends before end. Only end's removal
	// (a limit, meanwhile) ends the read there; otherwise the read waits
	// for the replica to deliver up to end (LeaderReads.Removed), asking
	// again while it waits (Tail.NextUpTo).
	t, err := FollowRidingOut(ctx, js, TailConfig{Stream: streamName, Subjects: subj, Filter: filter, Start: from})
	if err != nil {
		return fmt.Errorf("read %s: %w", node, err)
	}
	defer t.Stop()
	if t.Empty() && leader.Removed(ctx, end) {
		return nil
	}
	for {
		x, gone, err := t.NextUpTo(ctx, leader, end)
		if err != nil {
			return fmt.Errorf("read %s: %w", node, err)
		}
		if gone {
			return nil // end was removed meanwhile
		}
		m := t.Decode(x)
		seq := m.Event.Seq
		// Past end: the end message was removed by a limit meanwhile.
		if seq > end {
			return nil
		}
		if m.Event.Kind == "" {
			return fmt.Errorf("read %s: message %d: %w", node, seq, m.Event.Err)
		}
		if err := fn(m); err != nil {
			return err
		}
		if seq == end || (m.Pending == 0 && leader.Removed(ctx, end)) {
			return nil
		}
	}
}

// FollowRidingOut is [Follow] whose consumer's creation, answered by the
// cluster's meta leader only, is asked through [AskAgain]: again while
// it goes unanswered ([Unanswered]: no meta leader, a 503, a timeout),
// one attempt at a time, until it succeeds or ctx ends (bounded as
// [RideOut] when ctx has no deadline: a read verb, a console's follow).
// A creation asked while there is no meta leader (its server killed: the
// election takes 4–9 s) is never answered, not even once a new one is
// elected: a read that asked once waited out its caller's whole deadline
// ("ordered consumer on MESH: context deadline exceeded" 40 s after the
// kill, TestReadNodeRidesOutAMetaLeaderKill,
// TestJournalWarningsRideOutAMetaLeaderKill). An attempt answered after
// its deadline leaves a consumer the server deletes after
// OrderedInactive. Every reader that creates its consumer once and has
// no restart of its own (ReadFilter, JournalWarningSeqs, rollout/feed's
// Replay, query's lag and follow) creates it through this, not through
// Follow.
//
// Errors: as [AskAgain]'s (a [*NoLeaderError] naming cfg.Stream when the
// meta group had no leader until ctx ended); a refusal (the stream not
// found) at once; a [*DeniedError] as soon as the consumer's creation is
// denied.
func FollowRidingOut(ctx context.Context, js jetstream.JetStream, cfg TailConfig) (*Tail, error) {
	return AskAgain(ctx, js, cfg.Stream, func(ctx context.Context) (*Tail, error) { return Follow(ctx, js, cfg) })
}

// OrderedInactive is the inactivity threshold meshfold gives its ordered
// consumers: how long the server keeps one whose client vanished without
// deleting it (a crash). Short, so that restarts do not pile up consumers
// against the server's limit.
const OrderedInactive = 30 * time.Second

// DropOrdered asks the server to delete an ordered consumer once its
// reader has stopped, and does not wait for the answer. Ordered consumers
// are ephemeral but the client does not delete them on Stop: without
// this, every restart would leave one on the server until its inactivity
// threshold, and a busy process would reach the server's consumer limit
// (JetStream error 10026). The request is written to the connection (its
// Close flushes it); the server deletes the consumer when it takes the
// request, and a request lost on the way leaves it to its inactivity
// threshold (OrderedInactive), as a crash does. Awaited, the answer of a
// loaded or stalled JetStream API made every stop wait for it, up to the
// request's 5 s bound per reader: a node agent's SIGTERM took 8.3 s
// during an 8 s stall of the cluster (a fresh user's finding m6). Not
// while the connection is down: nothing would carry the request.
func DropOrdered(js jetstream.JetStream, stream string, cons jetstream.Consumer) {
	if info := cons.CachedInfo(); info != nil {
		dropConsumer(js, stream, info.Name)
	}
}

// dropConsumer asks the server to delete stream's consumer name and does
// not wait for the answer, as [DropOrdered] says: for a consumer with an
// inactivity threshold, which a lost request leaves to it.
func dropConsumer(js jetstream.JetStream, stream, name string) {
	nc := js.Conn()
	if !nc.IsConnected() {
		return
	}
	// A reply subject of the connection's response mux: the answer, when
	// it comes, is dropped there (a JetStream API request without one is
	// answered to no subject at all).
	_ = nc.PublishRequest(apiPrefix(js)+"CONSUMER.DELETE."+stream+"."+name, nc.NewRespInbox(), nil)
}

// ListNodes returns the names of the nodes the stream holds an event of
// kind k for ("*": of any kind), sorted, from the stream's subject index
// (one stream info request; no message is read). The operator verbs' --all
// and shell completion use it.
//
// Errors: the stream info's.
func ListNodes(ctx context.Context, stream jetstream.Stream, subj events.Subjects, k events.Kind) ([]string, error) {
	filters := []string{"*." + subj.Event("*", k)}
	if k.Operator() {
		filters = append(filters, subj.StoredNamedKind(k)) // named operators' events
	}
	seen := map[string]bool{}
	for _, f := range filters {
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(f))
		if err != nil {
			return nil, fmt.Errorf("stream info: %w", err)
		}
		for s := range info.State.Subjects {
			if node, _, err := subj.Parse(s); err == nil || errors.Is(err, events.ErrUnknownKind) {
				if node != "" {
					seen[node] = true
				}
			}
		}
	}
	nodes := make([]string, 0, len(seen))
	for n := range seen {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	return nodes, nil
}

// LastGetter reads a stream's newest message on a subject (wildcards
// allowed), as jetstream.Stream's GetLastMsgForSubject does: a
// jetstream.Stream (a direct get, which any replica may answer) or a
// [LeaderReads] (the stream's leader).
type LastGetter interface {
	GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error)
}

// LeaderReads reads single messages of one stream from its leader, with
// the JetStream API's message get ($JS.API.STREAM.MSG.GET.<stream>),
// never with a direct get: a direct get is answered by any replica that
// has caught up once (every 2 s a follower checks; nats-server 2.15), and
// one that has not yet applied a write the stream acknowledged answers
// "no message" or an older one. What a reader decides from a message it
// or someone wrote a moment ago (an expectation, a fence, a conflict's
// cause, a read's bound) is read here; what a reader only shows, or
// reads again when it changes, keeps the direct get, which spreads the
// reads over the replicas and is cheaper. The leader stores a message
// before the stream acknowledges it, so a read here after an
// acknowledgement sees it, except across a leader election, when a
// deposed leader may still answer (the server documents no guarantee
// then). The user needs $JS.API.STREAM.MSG.GET.<stream>, which reads any
// subject of the stream (no narrower grant exists): node agents and
// provisioners, whose grants name their own subjects, keep direct gets.
type LeaderReads struct {
	js     jetstream.JetStream
	stream string
}

// Leader returns the leader reads of stream on js's connection.
func Leader(js jetstream.JetStream, stream string) *LeaderReads {
	return &LeaderReads{js: js, stream: stream}
}

// GetLastMsgForSubject returns the newest message on subject (wildcards
// allowed) as the stream's leader stores it.
//
// It rides out a stream without a leader until ctx ends (the
// connection's DefaultTimeout, 5 s by default, when ctx has no
// deadline): a reply that says the group has none (the server's 503,
// "JetStream system temporarily unavailable", which every replica
// answers while its group elects one, and which a replica cut off from
// its leader answers at once while the leader, elsewhere, answers the
// message), no responders, or the connection reconnecting ([Unanswered])
// is not the answer: the read listens on for the leader's while it
// asks again, 50 ms later doubling to 1 s (±50 %). On a loaded 2-core
// machine elections came every few seconds and a read gave up at the
// first 503 (the suite's flake).
//
// Errors: jetstream.ErrMsgNotFound when there is none; the server's
// other *jetstream.APIError (a refusal: denied, bad request), at once;
// once ctx ends, the last refusal that said no leader (a 503, matching
// [Unanswered]) joined with ctx's error, or ctx's error alone.
func (l *LeaderReads) GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	return l.ask(ctx, leaderGetRequest{LastFor: subject})
}

// GetMsg returns the message at stream sequence seq as the stream's
// leader stores it, riding out a stream without a leader as
// GetLastMsgForSubject does. Errors: as GetLastMsgForSubject's.
func (l *LeaderReads) GetMsg(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	return l.ask(ctx, leaderGetRequest{Seq: seq})
}

// NextMsg returns the first message at or after stream sequence from on
// subject (wildcards allowed) as the stream's leader stores it.
//
// Where GetLastMsgForSubject with a wildcard has the server match every
// subject of its index the wildcard names (a partition's filter at
// 100,000 nodes: ~44,000 subjects, whatever the messages asked about),
// NextMsg has it look at the messages from from on, block by block
// through each block's own subject index, and stop at the first match:
// its cost grows with the messages from from to the stream's end (or to
// the match), not with the subjects. For "is anything of subject left
// past from" near the stream's end it is the cheaper read.
//
// It rides out a stream without a leader as GetLastMsgForSubject does.
//
// Errors: as GetLastMsgForSubject's (jetstream.ErrMsgNotFound when the
// leader holds none at or after from).
func (l *LeaderReads) NextMsg(ctx context.Context, from uint64, subject string) (*jetstream.RawStreamMsg, error) {
	return l.ask(ctx, leaderGetRequest{Seq: from, NextFor: subject})
}

// Removed reports whether the stream's leader no longer holds message
// seq: a read bounded by seq as the leader had it (ReadNode,
// JournalWarningSeqs, a partition's tail past its checkpoint) ends short
// of seq only then, once its consumer reports nothing pending, or while
// it waits for the next message ([Tail.NextUpTo]), since that consumer
// may sit on a replica behind the leader. Another error (no leader now)
// counts as held: the read waits for the rest. One request, not ridden
// out: its callers ask again while they wait.
func (l *LeaderReads) Removed(ctx context.Context, seq uint64) bool {
	ctx, cancel := l.bound(ctx)
	defer cancel()
	reply, err := l.js.Conn().RequestWithContext(ctx, l.subject(), l.body(leaderGetRequest{Seq: seq}))
	if err != nil {
		return false
	}
	_, err = l.decode(reply)
	return errors.Is(err, jetstream.ErrMsgNotFound)
}

type leaderGetRequest struct {
	Seq     uint64 `json:"seq,omitempty"`
	LastFor string `json:"last_by_subj,omitempty"`
	NextFor string `json:"next_by_subj,omitempty"`
}

// bound gives ctx, when it has no deadline, [WithRideOut]'s bound (a
// read verb's --timeout), else the connection's DefaultTimeout.
func (l *LeaderReads) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); !ok {
		if d := rideOutBound(ctx, l.js.Options().DefaultTimeout); d > 0 {
			return context.WithTimeout(ctx, d)
		}
	}
	return ctx, func() {}
}

// subject is the stream's message-get subject, under the context's API
// prefix or domain.
func (l *LeaderReads) subject() string {
	return apiPrefix(l.js) + "STREAM.MSG.GET." + l.stream
}

func (l *LeaderReads) body(req leaderGetRequest) []byte {
	body, _ := json.Marshal(req) // a number and a string: cannot fail
	return body
}

// leaderFirstAsk bounds a read's first ask (LeaderReads.ask): past it
// the read asks again, so that a leader elected meanwhile (the one asked
// was killed) answers. leaderRetryMin and leaderRetryMax pace the asks
// after it. Variables for the tests.
var (
	leaderFirstAsk = 2 * time.Second
	leaderRetryMin = 50 * time.Millisecond
	leaderRetryMax = time.Second
)

// ask is GetMsg's and GetLastMsgForSubject's read: one request through
// the connection's shared reply subscription, the one a read costs while
// the stream has a leader; when its answer is not the leader's
// ([Unanswered]) or none came within leaderFirstAsk, asks again on a
// subscription of its own, which keeps every reply to every ask, until
// one that is not a 503 (the leader's message, or a refusal) or ctx's
// end. Several servers answer a message
// get: the leader with the message, a replica that knows its group has
// no leader with a 503. Nothing else answers, so any answer but a 503
// was the leader's, to an ask made after the call began.
func (l *LeaderReads) ask(ctx context.Context, req leaderGetRequest) (*jetstream.RawStreamMsg, error) {
	ctx, cancel := l.bound(ctx)
	defer cancel()
	nc, subj, body := l.js.Conn(), l.subject(), l.body(req)
	start := time.Now()
	actx, acancel := context.WithTimeout(ctx, leaderFirstAsk)
	reply, err := nc.RequestWithContext(actx, subj, body)
	acancel()
	if err == nil {
		var m *jetstream.RawStreamMsg
		if m, err = l.decode(reply); err == nil || !Unanswered(err) {
			return m, l.wrap(err)
		}
	}
	if ctx.Err() != nil || !Unanswered(err) {
		return nil, l.wrap(err)
	}
	refused := err // the last answer that said no leader
	noLeader := saidNoLeader(err)
	inbox := nc.NewInbox()
	replies := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe(inbox, replies)
	if err != nil {
		return nil, l.wrap(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // the read is over either way
	b := Backoff(leaderRetryMin, leaderRetryMax)
	if err := nc.PublishRequest(subj, inbox, body); err != nil && !Unanswered(err) {
		return nil, l.wrap(err)
	}
	timer := time.NewTimer(b.NextBackOff())
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// Said as RideOut says it (a fresh user's finding V3).
				return nil, &NoLeaderError{Stream: l.stream, Err: l.wrap(errors.Join(refused, ctx.Err())),
					NoLeader: noLeader, Waited: time.Since(start)}
			}
			return nil, l.wrap(errors.Join(refused, ctx.Err()))
		case <-timer.C:
			if err := nc.PublishRequest(subj, inbox, body); err != nil {
				if !Unanswered(err) {
					return nil, l.wrap(err)
				}
				refused = err
			}
			timer.Reset(b.NextBackOff())
		case reply := <-replies:
			if len(reply.Data) == 0 && reply.Header.Get("Status") == "503" {
				refused = nats.ErrNoResponders
				continue
			}
			m, err := l.decode(reply)
			if err == nil || !Unanswered(err) {
				return m, l.wrap(err)
			}
			refused = err
			noLeader = noLeader || saidNoLeader(err)
		}
	}
}

// wrap names the read in err (nil stays nil). jetstream.ErrMsgNotFound
// is returned bare, as the client's own gets return it.
func (l *LeaderReads) wrap(err error) error {
	if err == nil || err == jetstream.ErrMsgNotFound {
		return err
	}
	return fmt.Errorf("message get from the leader of %s: %w", l.stream, err)
}

// decode reads a message-get reply: the message, jetstream.ErrMsgNotFound,
// or the server's *jetstream.APIError.
func (l *LeaderReads) decode(reply *nats.Msg) (*jetstream.RawStreamMsg, error) {
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Header  []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return nil, err
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return nil, jetstream.ErrMsgNotFound
		}
		return nil, resp.Error
	}
	m := resp.Message
	if m == nil {
		return nil, jetstream.ErrInvalidJetStreamResponse
	}
	var h nats.Header
	if len(m.Header) > 0 {
		var err error
		if h, err = nats.DecodeHeadersMsg(m.Header); err != nil {
			return nil, fmt.Errorf("headers: %w", err)
		}
	}
	return &jetstream.RawStreamMsg{Subject: m.Subject, Sequence: m.Seq, Header: h, Data: m.Data, Time: m.Time}, nil
}

// LastPerSubject calls fn with the newest message of each subject filter
// matches (one stored-subject filter, wildcards allowed: Subjects.StoredKind
// reads every node's newest event of a kind), in stream order, and
// returns once each subject's newest as of the call was read: it never
// waits for messages published later (some may be handed to fn too,
// newer than one already given: keep the highest sequence per subject).
// fn must not keep data. One plain consumer (no acks, in memory, one
// replica, last per subject), deleted when done; the server serves it
// from its subject index.
//
// Errors: fn's error, returned as is and ending the read; ctx's; the
// consumer's.
func LastPerSubject(ctx context.Context, js jetstream.JetStream, streamName, filter string, fn func(subject string, seq uint64, data []byte) error) error {
	return LastPerSubjectAt(ctx, js, streamName, filter, func(subject string, seq uint64, _ time.Time, data []byte) error {
		return fn(subject, seq, data)
	})
}

// LastPerSubjectAt is [LastPerSubject], handing fn each message's stored
// time too (an event's time, as [LastMsg] decodes it).
func LastPerSubjectAt(ctx context.Context, js jetstream.JetStream, streamName, filter string, fn func(subject string, seq uint64, t time.Time, data []byte) error) error {
	cons, err := js.CreateConsumer(ctx, streamName, jetstream.ConsumerConfig{
		FilterSubject:     filter,
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: OrderedInactive,
		MemoryStorage:     true,
		Replicas:          1,
	})
	if err != nil {
		return fmt.Errorf("read the newest of %s: %w", filter, err)
	}
	defer DropOrdered(js, streamName, cons)
	// The consumer's pending count at its creation is the number of
	// subjects: the read ends after as many, or once none is pending.
	left := cons.CachedInfo().NumPending
	if left == 0 {
		return nil
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(lastPerSubjectBatch))
	if err != nil {
		return fmt.Errorf("read the newest of %s: %w", filter, err)
	}
	defer it.Stop()
	for ; left > 0; left-- {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return fmt.Errorf("read the newest of %s: %w", filter, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("read the newest of %s: %w", filter, err)
		}
		if err := fn(m.Subject(), meta.Sequence.Stream, meta.Timestamp, m.Data()); err != nil {
			return err
		}
		if meta.NumPending == 0 {
			return nil
		}
	}
	return nil
}

// lastPerSubjectBatch is how many messages [LastPerSubject] asks for at
// a time.
const lastPerSubjectBatch = 1000
