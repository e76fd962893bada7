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
	// Backoff paces recreating a lost consumer: the wait before each
	// attempt after a loss. It is reset once a consumer read for
	// [FeedSteady]; a consumer lost sooner (a cluster that stalls again
	// and again) waits the next, longer step. Nil: [FeedBackoff].
	Backoff *backoff.ExponentialBackOff
	// Lost, when set, is told when the feed is lost (since, the moment
	// the loss was seen, or the follow's start when no consumer was made
	// yet) and when it reads again (the zero time): a node agent says it
	// in its lease, so that `fleet` and `state` show an agent that
	// follows no plan. It runs on the caller's goroutine.
	Lost func(since time.Time)
	// Heartbeat is the consumer's idle heartbeat: the follow takes its
	// consumer as lost after two missed ones (its server stopped) and
	// reads on through a new one; when the connection itself comes back
	// (its server restarted), the consumer is asked for at once instead
	// ([TailConfig.EndOnLoss]). 0: [FeedHeartbeat].
	Heartbeat time.Duration
	// Log receives the follow's lines; nil: slog.Default().
	Log *slog.Logger
}

// FeedHeartbeat is the default idle heartbeat of [FollowNode]'s
// consumer: a consumer on a server that stopped is taken as lost 10 s
// after its last heartbeat. The client's ordered consumer had the same,
// so an idle feed costs its server what it did (one heartbeat every 5 s).
const FeedHeartbeat = 5 * time.Second

// FeedSteady is how long a feed's consumer must read before its loss
// counts as a first loss again ([NodeFollow.Backoff] reset): one lost
// sooner (the evidence of fresh11 M8: consumers made during a stalled
// meta layer lived 26–33 s, then were lost again) waits the backoff's
// next step. Twelve heartbeats.
const FeedSteady = time.Minute

// FeedBackoff returns the default pacing of a lost feed's re-creation:
// 100 ms doubling to 15 s, each wait drawn at random from none to twice
// the step (the full jitter of a randomization factor of 1). Its first
// wait (0–200 ms) keeps a single server's kill as quick to ride out as
// before (50–150 ms); the jitter and the growth spread a fleet whose
// feeds were all lost at once (a meta leader lost: every agent's
// consumer with it) over up to 30 s, where every agent used to ask
// again within 100 ms of each loss and then back to back, one attempt
// after the other (a fresh user's finding M8: 300 agents, 1,100
// re-creations in 3 min against a meta layer just elected).
func FeedBackoff() *backoff.ExponentialBackOff {
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(1),
		backoff.WithMaxInterval(15*time.Second),
		backoff.WithMaxElapsedTime(0),
	)
}

// FollowNode follows f.Node's events of kind f.Kind after f.After, in
// stream order, until ctx is done: the one loop of the roles that act on
// the reconciler's effects (a node agent's plans, a provisioner's knocks
// and settles). Each message is decoded and verified (f.Verify) as it
// arrives; f.Handle gets each accepted message no newer accepted one
// supersedes (Msg.Pending, and with f.Latest a direct get), so a
// backlog is coalesced into its newest accepted message. Verify,
// Refused, Handle and OnTick all run on the caller's goroutine, one at a
// time.
//
// The feed reads through a plain ephemeral consumer that ends on its
// loss ([TailConfig.EndOnLoss]: two missed heartbeats, its deletion, a
// skipped delivery), created under a new name at each attempt, each
// attempt one ask of the meta leader (1 s long for the first
// [PromptFor] of a loss, then 5 s: a loaded server's answer, as
// [AskAgain]'s) with f.Backoff's jittered wait before it ([FeedBackoff]:
// a fleet's feeds lost together do not ask together); a lost feed reads
// on from the message after the last one read, through a new consumer,
// so no message is handed on twice or skipped (a message
// coalesced before the loss is still handed on when every newer one is
// refused). Not the client's ordered consumer: it re-made a lost consumer
// under one name, asked again for as long as it failed, and when the
// meta leader had placed that name on a server just killed (it counts a
// server offline only later), every ask went unanswered, or answered
// "consumer offline", until that server came back, while its reader saw
// no error (docs/architecture.md, "A node's feed across a crash of the
// stream's leader"). A loss is logged once (warn) with what the follow
// does, and its end (info) once a new consumer reads.
func FollowNode(ctx context.Context, js jetstream.JetStream, f NodeFollow) {
	f.Stream = f.Stream.WithDefaults()
	if f.Log == nil {
		f.Log = slog.Default()
	}
	if f.Heartbeat <= 0 {
		f.Heartbeat = FeedHeartbeat
	}
	b := f.Backoff
	if b == nil {
		b = FeedBackoff()
	}
	st := feedState{from: f.After}
	begun := time.Now()
	for ctx.Err() == nil {
		attempt := PromptAttempt
		if !st.lostAt.IsZero() && time.Since(st.lostAt) >= PromptFor {
			attempt = askAttemptMost
		}
		made, err := f.once(ctx, js, &st, attempt)
		if made && time.Since(st.readSince) >= FeedSteady {
			b.Reset()
		}
		if ctx.Err() != nil {
			return
		}
		d := b.NextBackOff()
		if st.lostAt.IsZero() {
			st.lostAt = time.Now()
			what := " feed lost; reading on through a new consumer from after the last one read"
			if !st.started {
				what = " feed not started; trying again"
			}
			f.Log.Warn(string(f.Kind)+what, "after", st.from, "in", d.Round(time.Millisecond), "err", err)
			if f.Lost != nil {
				since := st.lostAt
				if !st.started {
					since = begun
				}
				f.Lost(since)
			}
		} else {
			f.Log.Debug(string(f.Kind)+" feed still lost; trying again", "after", st.from, "in", d, "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
}

// feedState is what [FollowNode] keeps across its consumers: the
// sequence of the last message read, the newest accepted message skipped
// for a newer one (handed on if every newer one is refused), whether a
// consumer was ever made, since when none reads (zero while one does),
// and since when the newest one reads.
type feedState struct {
	from      uint64
	coalesced *Msg
	started   bool
	lostAt    time.Time
	readSince time.Time
}

// once runs one consumer from sequence st.from+1, its creation asked
// once, for up to attempt (an attempt unanswered, a 503, is not asked
// again here: FollowNode's backoff paces the next), updating st as it
// reads, and returns whether the consumer was made and why it stopped.
func (f *NodeFollow) once(ctx context.Context, js jetstream.JetStream, st *feedState, attempt time.Duration) (bool, error) {
	subj := f.Stream.Subjects()
	cfg := TailConfig{Stream: f.Stream.Name, Subjects: subj,
		Filter: subj.Stored(f.Node, f.Kind), Start: st.from + 1, Heartbeat: f.Heartbeat, EndOnLoss: true}
	actx, cancel := context.WithTimeout(ctx, attempt)
	tail, err := askAgainPaced(actx, js, f.Stream.Name, Unanswered, func(time.Duration) time.Duration { return attempt },
		func(ctx context.Context) (*Tail, error) { return Follow(ctx, js, cfg) })
	cancel()
	if err != nil {
		return false, err
	}
	if !st.lostAt.IsZero() {
		f.Log.Info(string(f.Kind)+" feed reads again", "after", st.from,
			"lost_for", time.Since(st.lostAt).Round(time.Millisecond))
		if f.Lost != nil {
			f.Lost(time.Time{})
		}
	}
	st.started, st.lostAt, st.readSince = true, time.Time{}, time.Now()
	for {
		var x Tailed
		select {
		case <-ctx.Done():
			tail.Stop()
			return true, ctx.Err()
		case <-f.Tick:
			if f.OnTick != nil {
				f.OnTick(ctx)
			}
			continue
		case x = <-tail.C():
		}
		if x.Err != nil {
			// Stopped aside: its consumer's deletion is asked, not
			// awaited (DropOrdered), but its reader's stop is not waited
			// for either.
			go tail.Stop()
			return true, x.Err
		}
		m := tail.Decode(x)
		st.from = m.Event.Seq
		var err error
		switch {
		case m.Event.Kind == "":
			err = m.Event.Err
			f.Log.Error("not a "+string(f.Kind)+" subject; skipped", "subject", m.Subject, "seq", st.from, "err", err)
		case f.Verify != nil:
			if err = f.Verify(m); err != nil && f.Refused != nil {
				f.Refused(ctx, m, err)
			}
		}
		superseded := m.Pending > 0 || f.Latest && f.newer(ctx, js, st.from)
		switch {
		case err != nil:
			if superseded || st.coalesced == nil {
				continue
			}
			m, st.coalesced = *st.coalesced, nil // the newest accepted one
		case superseded:
			f.Log.Info(string(f.Kind)+" coalesced with a newer one", string(f.Kind), st.from)
			st.coalesced = &m
			continue
		}
		st.coalesced = nil
		f.Handle(ctx, m)
		if ctx.Err() != nil {
			tail.Stop()
			return true, ctx.Err()
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
