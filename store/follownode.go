package store

import (
	"context"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
)

// NodeFollow configures [FollowNode].
type NodeFollow struct {
	// Stream is the stream's effective configuration (its name, prefix
	// and partition count), as OpenStream or EnsureStream return it.
	Stream StreamConfig
	// Node and Kind name what is followed: node's events of that kind.
	Node string
	Kind events.Kind
	// After is the sequence of the last message already handled: the
	// follow starts after it (0: from the first).
	After uint64
	// Verify is the role's trust rule (DESIGN.md §3, signatures): nil
	// accepts a message, an error refuses it and says why. It runs on
	// each message as it arrives, superseded or not. Nil accepts every
	// message.
	Verify func(Msg) error
	// Refused, when set, is told of each message Verify refused, with
	// Verify's error: the role logs it and reports it. A message whose
	// subject names no event is logged and skipped as refused.
	Refused func(context.Context, Msg, error)
	// Handle is called with each accepted message that no newer accepted
	// one supersedes: a backlog is coalesced into its newest accepted
	// message, also when messages after it were refused. Required.
	Handle func(context.Context, Msg)
	// Latest also takes a message as superseded when a direct get finds a
	// newer one of Node and Kind stored. Msg.Pending is the count at its
	// delivery, and the follow reads ahead, so a reader busy with an
	// older message may find its next one superseded already.
	Latest bool
	// OnTick, when set, runs at each value of Tick, between messages.
	Tick   <-chan time.Time
	OnTick func(context.Context)
	// Backoff paces recreating a failed consumer; it is reset once a
	// message was read. Nil: [Backoff](100 ms, 5 s).
	Backoff *backoff.ExponentialBackOff
	// Log receives the follow's lines; nil: slog.Default().
	Log *slog.Logger
}

// FollowNode follows f.Node's events of kind f.Kind after f.After, in
// stream order, until ctx is done: the one loop of the roles that act on
// the reconciler's effects (a node agent's plans, a provisioner's knocks
// and settles). Each message is decoded and verified (f.Verify) as it
// arrives; f.Handle gets each accepted message no newer accepted one
// supersedes (Msg.Pending, and with f.Latest a direct get), so a
// backlog is coalesced into its newest accepted message. A failed
// consumer is recreated, with f.Backoff, from the last message read.
// Verify, Refused, Handle and OnTick all run on the caller's goroutine,
// one at a time.
func FollowNode(ctx context.Context, js jetstream.JetStream, f NodeFollow) {
	f.Stream = f.Stream.WithDefaults()
	if f.Log == nil {
		f.Log = slog.Default()
	}
	b := f.Backoff
	if b == nil {
		b = Backoff(100*time.Millisecond, 5*time.Second)
	}
	from := f.After
	for ctx.Err() == nil {
		last, err := f.once(ctx, js, from)
		if last > from {
			from = last
			b.Reset()
		}
		if ctx.Err() != nil {
			return
		}
		d := b.NextBackOff()
		f.Log.Warn(string(f.Kind)+" consumer failed; recreating it", "after", from, "in", d, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
}

// once runs one ordered consumer from sequence from+1 and returns the
// sequence of the last message it read and why it stopped.
func (f *NodeFollow) once(ctx context.Context, js jetstream.JetStream, from uint64) (uint64, error) {
	subj := f.Stream.Subjects()
	tail, err := Follow(ctx, js, TailConfig{Stream: f.Stream.Name, Subjects: subj,
		Filter: subj.Stored(f.Node, f.Kind), Start: from + 1})
	if err != nil {
		return from, err
	}
	defer tail.Stop()
	var coalesced *Msg // the newest accepted message skipped for a newer one
	for {
		var x Tailed
		select {
		case <-ctx.Done():
			return from, ctx.Err()
		case <-f.Tick:
			if f.OnTick != nil {
				f.OnTick(ctx)
			}
			continue
		case x = <-tail.C():
		}
		if x.Err != nil {
			return from, x.Err
		}
		m := tail.Decode(x)
		from = m.Event.Seq
		var err error
		switch {
		case m.Event.Kind == "":
			err = m.Event.Err
			f.Log.Error("not a "+string(f.Kind)+" subject; skipped", "subject", m.Subject, "seq", from, "err", err)
		case f.Verify != nil:
			if err = f.Verify(m); err != nil && f.Refused != nil {
				f.Refused(ctx, m, err)
			}
		}
		superseded := m.Pending > 0 || f.Latest && f.newer(ctx, js, from)
		switch {
		case err != nil:
			if superseded || coalesced == nil {
				continue
			}
			m, coalesced = *coalesced, nil // the newest accepted one
		case superseded:
			f.Log.Info(string(f.Kind)+" coalesced with a newer one", string(f.Kind), from)
			coalesced = &m
			continue
		}
		coalesced = nil
		f.Handle(ctx, m)
		if ctx.Err() != nil {
			return from, ctx.Err()
		}
	}
}

// newer reports whether the stream holds a message of f.Node and f.Kind
// newer than seq (a direct get of the last one); false when it cannot
// tell.
func (f *NodeFollow) newer(ctx context.Context, js jetstream.JetStream, seq uint64) bool {
	stream, err := js.Stream(ctx, f.Stream.Name)
	if err != nil {
		return false
	}
	raw, err := stream.GetLastMsgForSubject(ctx, f.Stream.Subjects().Stored(f.Node, f.Kind))
	return err == nil && raw.Sequence > seq
}
