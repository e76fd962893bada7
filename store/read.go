package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
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
// Errors: [ErrNoMessage] when the stream holds none; a bad node name
// (matching events.ErrInvalid); the get's error otherwise. A payload that
// fails to decode is not an error: Msg.Event.Err says why.
func LastMsg(ctx context.Context, stream LastGetter, subj events.Subjects, node string, kind events.Kind) (Msg, error) {
	if !events.ValidName(node) {
		return Msg{}, &events.FieldError{Field: "node", Value: node, Err: events.ErrBadName}
	}
	stored := subj.Stored(node, kind)
	raw, err := stream.GetLastMsgForSubject(ctx, stored)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Msg{}, fmt.Errorf("last message on %s: %w", stored, ErrNoMessage)
	}
	if err != nil {
		return Msg{}, fmt.Errorf("last message on %s: %w", stored, err)
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
	last, err := leader.GetLastMsgForSubject(ctx, filter)
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
	t, err := Follow(ctx, js, TailConfig{Stream: streamName, Subjects: subj, Filter: filter, Start: from})
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

// OrderedInactive is the inactivity threshold meshfold gives its ordered
// consumers: how long the server keeps one whose client vanished without
// deleting it (a crash). Short, so that restarts do not pile up consumers
// against the server's limit.
const OrderedInactive = 30 * time.Second

// DropOrdered deletes an ordered consumer once its reader has stopped.
// Ordered consumers are ephemeral but the client does not delete them on
// Stop: without this, every restart would leave one on the server until
// its inactivity threshold, and a busy process would reach the server's
// consumer limit (JetStream error 10026).
func DropOrdered(js jetstream.JetStream, stream string, cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = js.DeleteConsumer(ctx, stream, info.Name) // gone already is fine
}

// ListNodes returns the names of the nodes the stream holds an event of
// kind k for ("*": of any kind), sorted, from the stream's subject index
// (one stream info request; no message is read). The operator verbs' --all
// and shell completion use it.
//
// Errors: the stream info's.
func ListNodes(ctx context.Context, stream jetstream.Stream, subj events.Subjects, k events.Kind) ([]string, error) {
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter("*."+subj.Event("*", k)))
	if err != nil {
		return nil, fmt.Errorf("stream info: %w", err)
	}
	seen := map[string]bool{}
	for s := range info.State.Subjects {
		if node, _, err := subj.Parse(s); err == nil || errors.Is(err, events.ErrUnknownKind) {
			if node != "" {
				seen[node] = true
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
// Errors: jetstream.ErrMsgNotFound when there is none; the server's
// *jetstream.APIError; the request's (nats.ErrNoResponders without a
// leader, ctx's error).
func (l *LeaderReads) GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	return l.get(ctx, leaderGetRequest{LastFor: subject})
}

// GetMsg returns the message at stream sequence seq as the stream's
// leader stores it. Errors: as GetLastMsgForSubject's.
func (l *LeaderReads) GetMsg(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	return l.get(ctx, leaderGetRequest{Seq: seq})
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
// Errors: as GetLastMsgForSubject's (jetstream.ErrMsgNotFound when the
// leader holds none at or after from).
func (l *LeaderReads) NextMsg(ctx context.Context, from uint64, subject string) (*jetstream.RawStreamMsg, error) {
	return l.get(ctx, leaderGetRequest{Seq: from, NextFor: subject})
}

// Removed reports whether the stream's leader no longer holds message
// seq: a read bounded by seq as the leader had it (ReadNode,
// JournalWarningSeqs, a partition's tail past its checkpoint) ends short
// of seq only then, once its consumer reports nothing pending, or while
// it waits for the next message ([Tail.NextUpTo]), since that consumer
// may sit on a replica behind the leader. Another error (no leader now)
// counts as held: the read waits for the rest.
func (l *LeaderReads) Removed(ctx context.Context, seq uint64) bool {
	_, err := l.GetMsg(ctx, seq)
	return errors.Is(err, jetstream.ErrMsgNotFound)
}

type leaderGetRequest struct {
	Seq     uint64 `json:"seq,omitempty"`
	LastFor string `json:"last_by_subj,omitempty"`
	NextFor string `json:"next_by_subj,omitempty"`
}

func (l *LeaderReads) get(ctx context.Context, req leaderGetRequest) (*jetstream.RawStreamMsg, error) {
	opts := l.js.Options()
	if _, ok := ctx.Deadline(); !ok && opts.DefaultTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.DefaultTimeout)
		defer cancel()
	}
	prefix := opts.APIPrefix
	if opts.Domain != "" {
		prefix = "$JS." + opts.Domain + ".API"
	}
	if prefix == "" {
		prefix = jetstream.DefaultAPIPrefix
	}
	if !strings.HasSuffix(prefix, ".") {
		prefix += "."
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	reply, err := l.js.Conn().RequestWithContext(ctx, prefix+"STREAM.MSG.GET."+l.stream, body)
	if err != nil {
		return nil, fmt.Errorf("message get from the leader of %s: %w", l.stream, err)
	}
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
		return nil, fmt.Errorf("message get from the leader of %s: %w", l.stream, err)
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
		if h, err = nats.DecodeHeadersMsg(m.Header); err != nil {
			return nil, fmt.Errorf("message get from the leader of %s: headers: %w", l.stream, err)
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
		if err := fn(m.Subject(), meta.Sequence.Stream, m.Data()); err != nil {
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
