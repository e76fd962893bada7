package rollouts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/store"
)

// LeaseKeyPrefix prefixes a fleet's controller lease key in the lease
// bucket (<stream>_LEASES): "rollout.<fleet>".
const LeaseKeyPrefix = "rollout."

// DefaultTickEvery is the least time between two ticks of one fleet
// (package rollout's duty 4: at most once a second).
const DefaultTickEvery = time.Second

// Config configures [Run] and [RunFleet].
type Config struct {
	// Stream is the stream's effective configuration (its name, prefix
	// and partition count), as store.EnsureStream returns it.
	Stream store.StreamConfig
	// Leases is the lease bucket a fleet's controller holds its lease in
	// (key [LeaseKeyPrefix]+fleet): one controller acts per fleet. Nil:
	// no lease (a test that runs one controller).
	Leases jetstream.KeyValue
	// Own, when set, are the keys whose plans count: a plan that does
	// not verify against them is not folded (as the reconciler folds it
	// as foreign). Nil: every plan counts.
	Own *store.Trust
	// Logger receives the controller's lines; nil discards them.
	Logger *slog.Logger
	// TickEvery is the least time between two ticks (0:
	// [DefaultTickEvery]).
	TickEvery time.Duration

	// leaders is the stream leader's watch the fleets' controllers share
	// (Run's); RunFleet called alone makes its own.
	leaders *leaders
}

func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.TickEvery <= 0 {
		c.TickEvery = DefaultTickEvery
	}
	c.Stream = c.Stream.WithDefaults()
	return c
}

// Run runs a controller for every fleet the stream holds a rollout start
// of, and for every fleet that gets one later, until ctx ends (it then
// returns nil). A fleet's controller that fails (its lease held by
// another process, the server gone for a while) is started again after a
// pause; its errors are logged.
//
// Errors: the follow of the start subjects failing.
func Run(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	cfg = cfg.withDefaults()
	// One read of the stream's leader a second for every fleet, not one
	// per fleet.
	cfg.leaders = newLeaders(js, cfg.Stream.Name)
	subj := cfg.Stream.Subjects()
	tail, err := store.Follow(ctx, js, store.TailConfig{Stream: cfg.Stream.Name, Subjects: subj,
		Filter: subj.Rollout("*", string(rollout.KindStart))})
	if err != nil {
		return fmt.Errorf("rollout controller: %w", err)
	}
	defer tail.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	seen := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case x := <-tail.C():
			if x.Err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("rollout controller: %w", x.Err)
			}
			fleet, _, ok := subj.ParseRollout(x.Msg.Subject())
			if !ok || seen[fleet] {
				continue
			}
			seen[fleet] = true
			wg.Add(1)
			go func() {
				defer wg.Done()
				superviseFleet(ctx, js, cfg, fleet)
			}()
		}
	}
}

// superviseFleet runs fleet's controller again after each failure, until
// ctx ends. A controller that finds no start of the fleet (its start
// aged out of the stream: --max-age, --max-bytes shorter than the
// rollout) says so once and waits for the fleet's next start, rather
// than failing again every second. A denial (a *store.DeniedError: the
// fleet's lease, its claim or a renewal, which the server's permissions
// deny) is said once, at error, for as long as the same subject is
// denied again: it is no outage, and a warning a second said nothing
// more; the controller is still started again each second, so that
// permissions given back start it without a restart.
func superviseFleet(ctx context.Context, js jetstream.JetStream, cfg Config, fleet string) {
	var denied string // the denial last said
	for {
		err := RunFleet(ctx, js, cfg, fleet)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			cfg.Logger.Warn("rollout controller: the fleet's rollout start is gone from the stream (its --max-age or --max-bytes dropped it): "+
				"its rollout cannot be refolded and takes no further step; waiting for the fleet's next start ('meshfold apply')", "fleet", fleet)
			if err := nextStart(ctx, js, cfg, fleet); err != nil && ctx.Err() == nil {
				cfg.Logger.Warn("rollout controller: waiting for the fleet's next start failed; starting again", "fleet", fleet, "err", err)
			}
			continue
		}
		var de *store.DeniedError
		switch {
		case errors.Is(err, store.ErrLeaseHeld):
			cfg.Logger.Debug("rollout controller: another process holds the fleet", "fleet", fleet, "err", err)
		case errors.As(err, &de) && de.Subject == denied:
			cfg.Logger.Debug("rollout controller: its lease is still denied", "fleet", fleet, "err", err)
		case de != nil:
			denied = de.Subject
			cfg.Logger.Error("rollout controller stopped: the server denies these credentials what it needs (err names the subject: the fleet's lease, say); no rollout of the fleet is stepped until they may (said once; tried again every second)",
				"fleet", fleet, "err", err)
		default:
			denied = ""
			cfg.Logger.Warn("rollout controller stopped; starting again", "fleet", fleet, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// nextStart returns once the stream holds a rollout start of fleet
// (at once when it holds one now), or ctx ended.
func nextStart(ctx context.Context, js jetstream.JetStream, cfg Config, fleet string) error {
	subj := cfg.Stream.Subjects()
	tail, err := store.Follow(ctx, js, store.TailConfig{Stream: cfg.Stream.Name, Subjects: subj, Filter: subj.Rollout(fleet, string(rollout.KindStart))})
	if err != nil {
		return err
	}
	defer tail.Stop()
	select {
	case <-ctx.Done():
		return nil
	case x := <-tail.C():
		return x.Err
	}
}

// RunFleet runs the controller of one fleet until ctx ends (then it
// returns nil): it holds the fleet's lease (cfg.Leases), finds the
// fleet's newest rollout start, refolds from it to the end of the stream
// as it was, carries out what was decided and not done, and then folds
// and carries out each event as it comes, ticking when the fold asks.
// While the rollout is idle (rollout.State.Idle) it follows only the
// fleet's rollout subjects, and refolds from the newest start when a
// start, a page or a verb is stored.
//
// Errors: store.ErrLeaseHeld (a *store.HeldError) when another process
// holds the fleet; an error wrapping jetstream.ErrMsgNotFound when the
// stream holds no start of the fleet; the stream's and the read's errors;
// the lease lost while running (taken by another process, or a renewal
// the server denied: a *store.DeniedError, when cfg.Leases is a
// store.LeaseBucket); its claim denied (the same).
func RunFleet(ctx context.Context, js jetstream.JetStream, cfg Config, fleet string) error {
	cfg = cfg.withDefaults()
	if cfg.leaders == nil {
		cfg.leaders = newLeaders(js, cfg.Stream.Name)
	}
	if !events.ValidName(fleet) {
		return &events.FieldError{Field: "fleet", Value: fleet, Err: events.ErrBadName}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var lease *store.Lease
	if cfg.Leases != nil {
		var err error
		lease, err = store.AcquireLease(ctx, cfg.Leases, LeaseKeyPrefix+fleet, store.NewHolder("rollout-controller", fleet), cfg.Logger)
		if err != nil {
			return err
		}
		defer func() {
			rctx, stop := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer stop()
			_ = lease.Release(rctx)
		}()
		go func() {
			select {
			case <-lease.Lost():
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	stream, err := js.Stream(ctx, cfg.Stream.Name)
	if err != nil {
		return fmt.Errorf("rollout controller %s: %w", fleet, err)
	}
	log := cfg.Logger.With("fleet", fleet)
	for {
		c := &controller{cfg: cfg, js: js, stream: stream, subj: cfg.Stream.Subjects(), fleet: fleet,
			pub: store.NewPublisher(js, cfg.Stream.Subjects()), state: rollout.NewState(fleet), log: log}
		var after uint64
		if after, err = c.run(ctx); err == nil && after > 0 {
			err = c.sleep(ctx, after)
		}
		if err != nil || ctx.Err() != nil {
			break
		}
		// Woken: refold from the newest start, with every node event.
	}
	if lease != nil && lease.Err() != nil {
		return fmt.Errorf("rollout controller %s: lease lost: %w", fleet, lease.Err())
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// sleep follows only the fleet's rollout subjects (named operators'
// verbs too: <prefix>.rollout.<fleet>.>) after sequence after,
// while the rollout is idle (rollout.State.Idle: final, nothing pending),
// and returns nil once a start, a page or an operator's verb is stored:
// the only events that can make the rollout act again. The nodes' events
// meanwhile are not read; the refold that follows reads them all, in
// order, so it decides what a controller that never slept would.
func (c *controller) sleep(ctx context.Context, after uint64) error {
	tail, err := c.follow(ctx, store.TailConfig{Stream: c.cfg.Stream.Name, Subjects: c.subj,
		Filter: c.subj.Rollout(c.fleet, ">"), Start: after + 1, EndOnLoss: true, Heartbeat: tailHeartbeat})
	if err != nil {
		return fmt.Errorf("rollout controller %s: %w", c.fleet, err)
	}
	// Stopped aside: its consumer's deletion is asked of the meta
	// leader, and a wake by a new stream leader is often one whose
	// server led the meta group too; the deletion then waited out its
	// 5 s before the refold began (a fresh user's finding M1).
	defer func() { go tail.Stop() }()
	c.log.Info("rollout controller idle: following only the fleet's rollout events", "rollout", c.state.Rollout.ID,
		"phase", c.state.Rollout.Phase, "after", after)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	elected := c.watchLeader(wctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-elected:
			// Its consumer lived on the old leader: refold, through a
			// new one.
			c.log.Info("rollout controller woken: the stream has a new leader")
			return nil
		case x := <-tail.C():
			if errors.Is(x.Err, store.ErrConsumerLost) && ctx.Err() == nil {
				// Its server crashed (or the consumer was deleted):
				// refold, through a new one.
				c.log.Info("rollout controller woken: its consumer was lost", "err", events.Short(x.Err.Error()))
				return nil
			}
			if x.Err != nil {
				return fmt.Errorf("rollout controller %s: %w", c.fleet, x.Err)
			}
			_, k, _ := c.subj.ParseRollout(x.Msg.Subject())
			switch rollout.Kind(k) {
			case rollout.KindTick, rollout.KindRecord, rollout.KindPublished, rollout.KindRefused:
				// The controller's own facts: nothing to act on.
			default:
				c.log.Info("rollout controller woken", "by", k, "seq", x.Meta.Sequence.Stream)
				return nil
			}
		}
	}
}

// follow starts a tail of tc for the controller, its consumer's
// creation asked again while unanswered, an attempt a second
// (store.AskAgainPromptly; the default bound, 30 s, then its error):
// the controller makes a consumer when woken, and a wake by the stream's
// new leader may come while the cluster's meta group, which answers a
// creation, has none yet (its leader killed with the stream's: a
// creation asked then is never answered). Asked once, it waited out the
// client's 5 s API timeout silent, and the run's failure a restart a
// second later (a fresh user's finding M1: the wants of a rollout
// applied 9.8 s after the kill went out 11.7 s after it was stored).
// The wait is said once, at WARN, and its end at INFO.
func (c *controller) follow(ctx context.Context, tc store.TailConfig) (*store.Tail, error) {
	var (
		since time.Time
		asks  int
	)
	nctx := store.WithWaitNote(ctx, func(err error) {
		asks++
		if since.IsZero() {
			since = time.Now()
			c.log.Warn("rollout controller: its consumer's creation is unanswered: waiting for "+store.WaitingFor(err)+
				"; asking again every "+store.PromptAttempt.String(), "err", events.Short(err.Error()))
		}
	})
	t, err := store.AskAgainPromptly(nctx, c.js, tc.Stream, func(ctx context.Context) (*store.Tail, error) {
		return followTail(ctx, c.js, tc)
	})
	if !since.IsZero() && err == nil {
		c.log.Info("rollout controller: its consumer's creation was answered; reading on", "after", time.Since(since).Round(time.Millisecond),
			"attempts", asks+1)
	}
	return t, err
}

// tailHeartbeat is the idle heartbeat of the controller's consumers
// (store.TailConfig.EndOnLoss: a plain consumer that ends on its loss):
// a consumer lost with its server is seen two heartbeats later, and read
// on through a new one. The client's ordered consumer, which the
// controller used, re-made a lost one itself after two missed 5 s
// heartbeats, under a name that could be placed on the dead server
// again (docs/architecture.md, "A node's feed across a crash of the
// stream's leader"): an idle controller read an apply stored 5.0 s
// after such a kill 10.0 s late. The reconciler's partitions read the
// same way, with the same heartbeat.
const tailHeartbeat = time.Second

// followTail is store.Follow; a variable for the tests, which make a
// creation go unanswered as one sent while the cluster has no meta
// leader does.
var followTail = store.Follow

type controller struct {
	cfg    Config
	js     jetstream.JetStream
	stream jetstream.Stream
	subj   events.Subjects
	fleet  string
	pub    *store.Publisher
	state  *rollout.State
	log    *slog.Logger

	live     bool
	lastTick time.Time
	inflight []pendingEvent
	// stale counts, by a step's want's id, the conflicts answered to it
	// while the want it expects was still the node's newest (outcome).
	stale map[string]int
}

// run refolds the fleet's rollout from its newest start and carries out
// what it decides, until ctx ends (0, nil) or the rollout is idle: it
// then returns the last sequence read, every effect carried out
// (rollout.State.Idle; the caller sleeps).
func (c *controller) run(ctx context.Context) (uint64, error) {
	start, err := c.leader().GetLastMsgForSubject(ctx, c.subj.Rollout(c.fleet, string(rollout.KindStart)))
	if err != nil {
		return 0, fmt.Errorf("rollout controller %s: newest start: %w", c.fleet, err)
	}
	end, err := store.StreamLastSeq(ctx, c.stream)
	if err != nil {
		return 0, fmt.Errorf("rollout controller %s: %w", c.fleet, err)
	}
	recorded, err := c.lastRecordCause(ctx)
	if err != nil {
		return 0, err
	}
	// The fleet's events are read as the reconciler's partitions and the
	// node agents read theirs: through a consumer that ends on its loss
	// (two missed heartbeats: its server killed -9), read on from after
	// the last message read through a new one, whose creation rides out
	// a meta leader's election. The client's ordered consumer, re-made
	// under one name after such a loss, could stay on the killed server,
	// and the controller then read nothing and said nothing: in
	// TestPausedRolloutResumesAcrossTheStreamLeadersKill under load, the
	// first batch settled and healthy on the stream, the second never
	// published, the controller silent for 2 minutes.
	follow := func(from uint64) (*store.Tail, error) {
		return c.follow(ctx, store.TailConfig{Stream: c.cfg.Stream.Name, Subjects: c.subj, Start: from, EndOnLoss: true, Heartbeat: tailHeartbeat})
	}
	tail, err := follow(start.Sequence)
	if err != nil {
		return 0, fmt.Errorf("rollout controller %s: %w", c.fleet, err)
	}
	defer func() {
		if tail != nil {
			// Aside, as sleep's: the caller sleeps or refolds next (the
			// consumer's deletion is asked, not awaited: DropOrdered).
			go tail.Stop()
		}
	}()
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	elected := c.watchLeader(wctx)
	read := start.Sequence - 1 // the last sequence read
	c.log.Info("rollout controller refolding", "from", start.Sequence, "to", end)
	var held []rollout.Effect // records decided while refolding, not on the stream yet
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	sinceWake := 0
	for {
		select {
		case <-ctx.Done():
			return 0, nil
		case <-timer.C:
			c.tick(ctx)
			c.drain(ctx)
		case <-elected:
			// Its consumer may have lived on the old leader's server:
			// read on from the next message through a new one (the
			// old one stopped aside: its deletion waits out a timeout
			// against a dead server).
			c.log.Info("rollout controller: the stream has a new leader; reading on through a new consumer", "from", read+1)
			// A new consumer that could not be made (the cluster
			// without a meta leader for longer than the creation's
			// bound) ends this run, which its supervisor starts
			// again: the old tail is stopped aside either way, and
			// never again on return (a fresh user's finding: a nil
			// tail stopped on return panicked a grouped reconciler,
			// twice in eight kills -9).
			next, err := follow(read + 1)
			go tail.Stop()
			tail = next
			if err != nil {
				return 0, fmt.Errorf("rollout controller %s: reading on after a new stream leader: %w", c.fleet, err)
			}
		case x := <-tail.C():
			if errors.Is(x.Err, store.ErrConsumerLost) && ctx.Err() == nil {
				// Its server crashed, whichever server led the
				// stream (two missed heartbeats), or a delivery was
				// skipped: read on as after a new leader.
				c.log.Info("rollout controller: its consumer was lost; reading on through a new consumer", "from", read+1,
					"err", events.Short(x.Err.Error()))
				next, err := follow(read + 1)
				go tail.Stop()
				tail = next
				if err != nil {
					return 0, fmt.Errorf("rollout controller %s: reading on after its consumer was lost: %w", c.fleet, err)
				}
				continue
			}
			if x.Err != nil {
				return 0, fmt.Errorf("rollout controller %s: %w", c.fleet, x.Err)
			}
			seq := x.Meta.Sequence.Stream
			read = seq
			if in, ok := c.input(x); ok {
				effs := c.state.Fold(in)
				if c.live {
					c.carry(ctx, effs)
				} else {
					for _, e := range effs {
						if e.Record != nil && e.Cause > recorded {
							held = append(held, e)
						}
					}
				}
			}
			if !c.live && seq >= end {
				c.live = true
				if e, ok := c.state.UnrecordedPause(recorded); ok {
					// Paused by this refold on a plan its keys do not
					// verify, where the records' fold was not: recorded
					// now, so `rollout status` says it too.
					held = append(held, e)
				}
				c.log.Info("rollout controller live", "seq", seq, "records", len(held), "pending", len(c.state.Pending()))
				c.carry(ctx, held)
				held = nil
				c.carry(ctx, c.state.Pending())
				c.drain(ctx)
			}
			// The wake is computed when the tail is drained (it walks the
			// targets in progress), and at least every 256 messages.
			if sinceWake++; c.live && (len(tail.C()) == 0 || sinceWake >= 256) {
				sinceWake = 0
				c.drain(ctx)
				if c.state.Idle() && ctx.Err() == nil {
					// Every effect carried out: sleep after seq (the
					// fleet's rollout events buffered past it are read
					// again by the sleep's follow).
					return seq, nil
				}
				c.schedule(timer)
			}
		}
	}
}

// watchLeader returns a channel that gets a value each time the
// stream's leader changes ([leaders.watch]), until ctx ends: through the
// watch the controllers of Run's fleets share, or one of this controller's
// own when RunFleet was called alone.
func (c *controller) watchLeader(ctx context.Context) <-chan struct{} {
	return c.cfg.leaders.watch(ctx)
}

// input returns the fold's input of a tailed message, false for a message
// the fleet's rollout does not read.
func (c *controller) input(x store.Tailed) (rollout.Input, bool) {
	return feed.Input(c.subj, c.state, c.cfg.Own, feed.FromTailed(x))
}

// schedule sets timer to the fold's next wake, no sooner than TickEvery
// after the last tick.
func (c *controller) schedule(timer *time.Timer) {
	timer.Stop()
	wake, ok := c.state.NextWake()
	if !ok {
		return
	}
	d := time.Until(wake)
	if gap := time.Until(c.lastTick.Add(c.cfg.TickEvery)); gap > d {
		d = gap
	}
	timer.Reset(max(d, 0))
}

// tick publishes a tick: time passed.
func (c *controller) tick(ctx context.Context) {
	r := c.state.Rollout
	if r == nil {
		return
	}
	c.lastTick = time.Now()
	c.append(ctx, rollout.KindTick, &rollout.Tick{Rollout: r.ID}, "")
}

// carry carries out effects in order, pipelined: the wants are
// published without waiting for each acknowledgement, then each outcome
// is recorded as its acknowledgement comes, in order; records are
// appended without waiting (see drain).
func (c *controller) carry(ctx context.Context, effs []rollout.Effect) {
	var (
		steps []rollout.Effect
		sends []sent
	)
	flush := func() {
		c.await(ctx, sends, func(i int, ack *jetstream.PubAck, err error) {
			if err == nil {
				c.published(ctx, steps[i].Want, ack.Sequence)
				return
			}
			c.outcome(ctx, steps[i], 0, store.ServerError(err))
		})
		steps, sends = steps[:0], sends[:0]
	}
	for _, e := range effs {
		if ctx.Err() != nil {
			return
		}
		if e.Record != nil {
			if rec := e.Record; rec.What == "paused" && rec.Node != "" {
				// The fold's own pause on a plan its keys do not verify
				// (rollout.State.Fold): said where the operator looks.
				c.log.Error("rollout controller paused the rollout on a plan it cannot verify", "rollout", rec.Rollout, "node", rec.Node,
					"keys", c.cfg.Own.String(), "record", rec.Msg)
			}
			c.appendAsync(ctx, rollout.KindRecord, e.Record, e.ID())
			continue
		}
		want, err := c.wantOf(ctx, e)
		if err != nil {
			continue // refused already
		}
		fut, err := c.pub.AppendAsync(ctx, e.Want.Node, want, wantOpts(e)...)
		if err != nil {
			flush()
			c.publishWant(ctx, e)
			continue
		}
		steps, sends = append(steps, e), append(sends, sentOf(fut))
		if len(sends) >= maxInflight {
			flush()
		}
	}
	flush()
}

// maxInflight bounds the wants and records published and not yet
// acknowledged.
const maxInflight = 1024

// wantOf returns the want a step publishes; for a revert by copy, the
// modules of the want at CopyOf. A want that cannot be read is recorded
// refused, and the error returned.
func (c *controller) wantOf(ctx context.Context, e rollout.Effect) (*events.Want, error) {
	w := e.Want
	modules := w.Modules
	if modules == nil && w.CopyOf > 0 {
		var err error
		if modules, err = c.wantAt(ctx, w.Node, w.CopyOf); err != nil {
			switch {
			case ctx.Err() != nil:
			case errors.Is(err, jetstream.ErrMsgNotFound):
				// Dropped by the stream's limits during the rollout,
				// and not carried by the start (an older apply's
				// start, or a target past its bound: rollout.CarryBytes).
				c.refuse(ctx, w, 0, "", fmt.Sprintf("the previous want #%d could not be read: it is gone from the stream (its --max-age or --max-bytes dropped it) "+
					"and the rollout's start does not carry it; give the node its want by hand ('meshfold want %s -f FILE')", w.CopyOf, w.Node))
			default:
				c.refuse(ctx, w, 0, "", fmt.Sprintf("the previous want #%d could not be read: %v", w.CopyOf, err))
			}
			return nil, err
		}
	}
	if modules == nil {
		modules = []events.WantModule{}
	}
	return events.Stamp(&events.Want{Modules: modules}, time.Now()), nil
}

// refuse records a step's want refused: the node's newest want was
// last (0: none read), whose message id is lastID, and why says so.
func (c *controller) refuse(ctx context.Context, w *rollout.WantEffect, last uint64, lastID, why string) {
	c.log.Warn("rollout want refused", "node", w.Node, "step", w.Step, "last", last, "why", events.ErrorText(why))
	c.appendAsync(ctx, rollout.KindRefused, &rollout.Refused{Rollout: w.Rollout, Node: w.Node, Step: w.Step, Last: last, LastID: lastID,
		Error: events.ErrorText(why)}, rollout.OutcomeID(c.fleet, w.Rollout, w.Node, w.Step))
}

// changedWhy says why a step's want was refused as a conflict: the
// node's newest want, seq with message id id, is not the one the step
// expected, and who wrote it (a rollout's step names itself in its id).
// It was the empty string, and serve logged why="\"\"" (a fresh user's
// finding G2).
func changedWhy(w *rollout.WantEffect, seq uint64, id string) string {
	by := "published by hand (its message id names no rollout's step)"
	if fleet, r, node, step, ok := rollout.ParseWantID(id); ok && node == w.Node {
		by = fmt.Sprintf("published by rollout %d of fleet %s, its %s step (message id %s)", r, fleet, step, id)
	}
	expected := fmt.Sprintf("#%d, the one the step was decided against", w.Expect)
	if w.Expect == 0 {
		expected = "none, as the step was decided when the node had no want"
	}
	return fmt.Sprintf("the node's newest want is #%d, not %s: #%d was %s", seq, expected, seq, by)
}

// publishWant publishes a step's want with its message id, expecting the
// want it was decided against, and records the outcome, retrying what
// passes by itself.
func (c *controller) publishWant(ctx context.Context, e rollout.Effect) {
	want, err := c.wantOf(ctx, e)
	if err != nil {
		return
	}
	var (
		ack  store.Ack
		ride ride
	)
	for {
		ack, err = c.pub.Append(ctx, e.Want.Node, want, wantOpts(e)...)
		if err == nil || !store.Transient(err) || !c.rideAgain(ctx, &ride, err, 1) {
			break
		}
	}
	c.answeredAgain(&ride)
	c.outcome(ctx, e, ack.Seq, err)
}

// wantOpts are a step's want's publish options: its step's message id,
// the want it was decided against, and why the step gives it
// (rollout.HeaderWhy), which the node's timeline shows.
func wantOpts(e rollout.Effect) []store.AppendOpt {
	opts := []store.AppendOpt{store.WithMsgID(e.ID()), store.WithExpectLastSubjectSeq(e.Want.Expect)}
	if e.Want.Why != "" {
		opts = append(opts, store.WithHeader(rollout.HeaderWhy, e.Want.Why))
	}
	return opts
}

// outcome records what the server answered to a step's want: stored at
// seq (err nil), or err. A conflict is read back from the node's newest
// want: the step's own (published), the one the step expects (a stale
// refusal: sent again, at most staleConflictsMax times), another
// (refused: changed by hand), or none while the step expected one: the
// want it was decided against is gone from the stream (its limits
// dropped it), and the step's want is published again expecting none.
func (c *controller) outcome(ctx context.Context, e rollout.Effect, seq uint64, err error) {
	w, id := e.Want, e.ID()
	switch {
	case ctx.Err() != nil:
		return
	case err == nil:
		c.published(ctx, w, seq)
	case errors.Is(err, store.ErrConflict):
		// Stored already by this step (a restart past the duplicate
		// window), changed by hand (the newest want's id says which),
		// or the want expected gone from the stream.
		last, lerr := c.lastWant(ctx, w.Node)
		switch {
		case ctx.Err() != nil:
			return
		case lerr == nil && last.MsgID == id:
			c.published(ctx, w, last.Event.Seq)
		case lerr == nil && w.Expect != 0 && last.Event.Seq == w.Expect:
			// The want the step was decided against is still the
			// node's newest: the refusal was not this subject's
			// state. Seen right after a stream leader's stepdown, a
			// new leader answering before it had applied its log
			// (twice in ~19 runs of 6 stepdowns under fenced
			// publishes; docs/architecture.md). Refused, it would
			// read as a want changed by hand and halt the rollout:
			// sent again, a copy under the same id and expectation,
			// at most staleConflictsMax times.
			if c.stale == nil {
				c.stale = map[string]int{}
			}
			c.stale[id]++
			if n := c.stale[id]; n <= staleConflictsMax {
				c.log.Info("rollout controller: the server refused a step's want as a conflict while the want it was decided against is still the node's newest; sending it again",
					"node", w.Node, "step", w.Step, "expect", w.Expect, "attempt", n)
				if c.wait(ctx, n-1) {
					c.publishWant(ctx, e)
				}
				return
			}
			delete(c.stale, id)
			c.refuse(ctx, w, last.Event.Seq, last.MsgID, fmt.Sprintf("the server refused the want as a conflict %d times while want #%d, the one the step was decided against, was the node's newest", staleConflictsMax+1, w.Expect))
		case lerr == nil:
			c.refuse(ctx, w, last.Event.Seq, last.MsgID, changedWhy(w, last.Event.Seq, last.MsgID))
		case errors.Is(lerr, store.ErrNoMessage) && w.Expect != 0:
			// The want the step was decided against is gone from the
			// stream, and no want took its place: the stream's limits
			// dropped it (--max-age, --max-bytes: a rollout longer
			// than the age, a node whose want did not change for
			// longer). The fence guards against overwriting a want
			// published since the decision; a want that is gone is no
			// such want, and one published since would be on the
			// subject still (a limit drops the oldest first: it would
			// go only after the event that decided the step, just
			// folded). Published again expecting no want: one
			// published meanwhile is still refused.
			c.log.Info("rollout controller: the want a step was decided against is gone from the stream (its --max-age or --max-bytes dropped it); publishing the step's want expecting the node has none",
				"node", w.Node, "step", w.Step, "rollout", w.Rollout, "gone", w.Expect)
			c.publishWant(ctx, expectingNone(e))
		case errors.Is(lerr, store.ErrNoMessage):
			c.refuse(ctx, w, 0, "", "the server refused the want as a conflict, and the node holds no want now")
		default:
			c.refuse(ctx, w, 0, "", lerr.Error())
		}
	case store.Transient(err):
		c.publishWant(ctx, e) // retried until it passes
	default:
		c.refuse(ctx, w, 0, "", err.Error())
	}
}

// staleConflictsMax bounds how many times a step's want refused as a
// conflict, while the want it expects is still the node's newest, is
// sent again before it is refused (controller.outcome).
const staleConflictsMax = 3

// expectingNone is e with its want expecting the node's want subject
// to hold no message (Nats-Expected-Last-Subject-Sequence 0).
func expectingNone(e rollout.Effect) rollout.Effect {
	w := *e.Want
	w.Expect = 0
	e.Want = &w
	return e
}

// leaderRideOut bounds how long the controller asks the stream's
// leader again for a read a step's outcome rests on (lastWant), while
// the stream has no leader (store.Unanswered), as the reconciler's
// leader reads ride out an election (engine's electionRideOut). A
// variable for the tests.
var leaderRideOut = 20 * time.Second

// leaderLastMsg is store.LastMsg; a variable for the tests, which make
// it answer as a stream without a leader does.
var leaderLastMsg = store.LastMsg

// lastWant returns node's newest want as the stream's leader has it,
// asking again (c.wait's pacing) while the answer says the stream has no
// leader ([store.Unanswered]: a 503, no responders, a timeout, the
// connection reconnecting), for at most leaderRideOut: a leader
// election, which a loaded cluster holds every few seconds, must not
// refuse a step's want with the read's error (each read itself rides
// out a leaderless stream for the connection's default timeout).
//
// Errors: store.ErrNoMessage; ctx's; the read's last error past
// leaderRideOut, or at once when it is not unanswered.
func (c *controller) lastWant(ctx context.Context, node string) (store.Msg, error) {
	deadline := time.Now().Add(leaderRideOut)
	for attempt := 0; ; attempt++ {
		m, err := leaderLastMsg(ctx, c.leader(), c.subj, node, events.KindWant)
		if err == nil || !store.Unanswered(err) || ctx.Err() != nil || time.Now().After(deadline) {
			return m, err
		}
		c.log.Warn("rollout controller: the stream's leader did not answer; asking again", "node", node, "err", events.Short(err.Error()))
		if !c.wait(ctx, attempt) {
			return m, ctx.Err()
		}
	}
}

func (c *controller) published(ctx context.Context, w *rollout.WantEffect, seq uint64) {
	c.appendAsync(ctx, rollout.KindPublished, &rollout.Published{Rollout: w.Rollout, Node: w.Node, Step: w.Step, Want: seq},
		rollout.OutcomeID(c.fleet, w.Rollout, w.Node, w.Step))
}

// leader reads the stream from its leader: what the controller decides
// from a message written a moment ago (the newest start and record it
// refolds from, a conflicting want, the want a step copies) must not be
// read from a replica that has not applied it yet, which answers "no
// message" or an older one (store.LeaderReads).
func (c *controller) leader() *store.LeaderReads { return store.Leader(c.js, c.cfg.Stream.Name) }

// wantAt reads the modules of the want stored at seq (the want a revert
// gives back, copied: the node's want before the rollout), asking again, paced by c.wait,
// while the read fails for another reason than the message being gone
// (the stream's leader away for longer than a read rides out, the
// connection lost): it says once, at WARN, what it waits for, and at
// INFO when the want was read (as the publishes' ride-out does).
//
// Errors: one wrapping jetstream.ErrMsgNotFound when the stream no
// longer holds seq; the want's decoding; ctx's.
func (c *controller) wantAt(ctx context.Context, node string, seq uint64) ([]events.WantModule, error) {
	var since time.Time
	for attempt := 0; ; attempt++ {
		m, err := leaderGetMsg(ctx, c.leader(), seq)
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgNotFound) || ctx.Err() != nil {
				return nil, err
			}
			if since.IsZero() {
				since = time.Now()
				c.log.Warn("rollout controller: a revert's read of the want it gives back failed: waiting for "+waitingFor(err)+"; asking again until it is read",
					"node", node, "want", seq, "err", events.Short(err.Error()))
			}
			if !c.wait(ctx, attempt) {
				return nil, ctx.Err()
			}
			continue
		}
		if !since.IsZero() {
			c.log.Info("rollout controller: a revert's read of the want it gives back passed", "node", node, "want", seq,
				"after", time.Since(since).Round(time.Millisecond), "attempts", attempt+1)
		}
		ev, err := c.subj.DecodeEvent(m.Subject, m.Data, seq, m.Time)
		if err != nil {
			return nil, err
		}
		if ev.Err != nil {
			return nil, ev.Err
		}
		want, ok := ev.Payload.(*events.Want)
		if !ok {
			return nil, fmt.Errorf("#%d is a %s, not a want", seq, ev.Kind)
		}
		return want.Modules, nil
	}
}

// leaderGetMsg is store.LeaderReads.GetMsg; a variable for the tests,
// which count the reads.
var leaderGetMsg = func(ctx context.Context, l *store.LeaderReads, seq uint64) (*jetstream.RawStreamMsg, error) {
	return l.GetMsg(ctx, seq)
}

// waitingFor says what a read that failed with err waits for: the
// stream's leader or the connection when the stream did not answer
// (store.Unanswered), else the stream to answer the read.
func waitingFor(err error) string {
	if store.Unanswered(err) {
		return store.WaitingFor(err)
	}
	return "the stream to answer the read"
}

// append publishes a rollout event of the fleet under id (none when
// empty), retrying what passes by itself. One that cannot be stored is
// logged and skipped (DESIGN.md §10): the controller goes on.
func (c *controller) append(ctx context.Context, k rollout.Kind, p any, id string) {
	if e, ok := c.message(k, p, id); ok {
		c.publish(ctx, e)
	}
}

// appendAsync is append without waiting for the acknowledgement: the
// event joins the ones drain waits for (at most maxInflight).
func (c *controller) appendAsync(ctx context.Context, k rollout.Kind, p any, id string) {
	e, ok := c.message(k, p, id)
	if !ok {
		return
	}
	fut, err := c.js.PublishMsgAsync(e.msg)
	if err != nil {
		c.publish(ctx, e)
		return
	}
	e.sent = sentOf(fut)
	c.inflight = append(c.inflight, e)
	if len(c.inflight) >= maxInflight {
		c.drain(ctx)
	}
}

// pendingEvent is a rollout event ready to publish (its message id, if
// any, in its header), or published and not yet acknowledged (sent).
type pendingEvent struct {
	k    rollout.Kind
	id   string
	msg  *nats.Msg
	sent sent
}

// message stamps p and makes its message on the fleet's subject of kind
// k, under id when not empty; false (logged) when p does not encode.
func (c *controller) message(k rollout.Kind, p any, id string) (pendingEvent, bool) {
	rollout.Stamp(p, time.Now())
	data, err := json.Marshal(p)
	if err != nil {
		c.log.Error("rollout event not encoded", "kind", k, "err", err)
		return pendingEvent{}, false
	}
	e := pendingEvent{k: k, id: id, msg: &nats.Msg{Subject: c.subj.Rollout(c.fleet, string(k)), Data: data}}
	if id != "" {
		// In the header itself, not through a publish option: a copy
		// sent again (await) carries it.
		e.msg.Header = nats.Header{jetstream.MsgIDHeader: []string{id}}
	}
	return e, true
}

// publish publishes e and waits for its acknowledgement, retrying what
// passes by itself; one that cannot be stored is logged and skipped.
func (c *controller) publish(ctx context.Context, e pendingEvent) {
	var ride ride
	defer c.answeredAgain(&ride)
	for {
		_, err := c.js.PublishMsg(ctx, e.msg)
		err = store.ServerError(err)
		if err == nil || ctx.Err() != nil {
			return
		}
		if !store.Transient(err) || !c.rideAgain(ctx, &ride, err, 1) {
			if ctx.Err() == nil {
				c.log.Error("rollout event not stored: skipped", "kind", e.k, "id", e.id, "err", events.Short(err.Error()))
			}
			return
		}
	}
}

// drain waits for every event appendAsync published (await: one whose
// answer is lost is sent again, under its id); one that cannot be stored
// is logged and skipped (DESIGN.md §10).
func (c *controller) drain(ctx context.Context) {
	pend := c.inflight
	c.inflight = nil
	sends := make([]sent, len(pend))
	for i, e := range pend {
		sends[i] = e.sent
	}
	c.await(ctx, sends, func(i int, _ *jetstream.PubAck, err error) {
		if err != nil {
			e := pend[i]
			c.log.Error("rollout event not stored: skipped", "kind", e.k, "id", e.id, "err", events.Short(store.ServerError(err).Error()))
		}
	})
}

// ackWait bounds how long the controller waits for the answer to a
// publish it sent without waiting (a step's want, a rollout event)
// before it takes the answer as lost: a publish the stream's leader had
// when it was killed is never answered, and nats.go keeps waiting for it
// unless its JetStream context has a publish-async timeout (Serve's: 10
// s; RunFleet's caller may give none). The reconciler's effects wait as
// long (engine's ackTimeout). A variable for the tests.
var ackWait = 5 * time.Second

// errNoAnswer: a publish got no answer within ackWait.
var errNoAnswer = errors.New("no answer from the stream")

// sent is a publish sent without waiting: its message, a copy of which
// is sent again when its answer is lost (the same subject, payload and
// headers: its message id and, for a want, its expected last subject
// sequence), and its answer's channels.
type sent struct {
	msg  *nats.Msg
	ok   <-chan *jetstream.PubAck
	errc <-chan error
}

func sentOf(f jetstream.PubAckFuture) sent { return sent{msg: f.Msg(), ok: f.Ok(), errc: f.Err()} }

// await hands each publish of sends its answer, in order, through
// answer (ack, or the server's refusal: pass it through
// store.ServerError), and returns true; false when ctx ended first.
// It rides out what the reconciler's effect publishes ride out
// (engine's pubride, docs/architecture.md "Effect publishes ride out the
// loss of the client's server", sharing store.Resendable and
// store.SendAgain): when the oldest publish waiting gets no answer within
// ackWait, or an answer that leaves it unanswered (store.Resendable: the
// client disconnected, no responders, a 503, a timeout, the server's "in
// process"), the controller says so once (rideAgain), paces itself, and
// sends again a copy of it and of each later one unanswered too (one
// still awaited only after a timeout), until the stream answers. Exactly
// once holds: a copy of a message stored before is answered as a
// duplicate of its sequence within the stream's dedup window, and a
// step's want also carries the expectation it was decided against, so
// that a copy past the window is refused as a conflict and read back as
// its own (outcome). The controller's rollout events the fold reads
// twice (published, refused, record) change nothing the second time.
// There is no bound on the ride-out: the controller has nothing else to
// do, giving up would lose what it decided, and ctx (the lease lost, the
// process stopping) still ends it.
func (c *controller) await(ctx context.Context, sends []sent, answer func(i int, ack *jetstream.PubAck, err error)) bool {
	var ride ride
	defer c.answeredAgain(&ride)
	timer := time.NewTimer(ackWait)
	defer timer.Stop()
	for i := 0; i < len(sends); {
		timer.Reset(ackWait)
		var cause error
		select {
		case ack := <-sends[i].ok:
			c.answeredAgain(&ride)
			answer(i, ack, nil)
			i++
			continue
		case err := <-sends[i].errc:
			if !store.Resendable(err) {
				c.answeredAgain(&ride)
				answer(i, nil, err)
				i++
				continue
			}
			cause = err
		case <-timer.C:
			cause = errNoAnswer
		case <-ctx.Done():
			return false
		}
		if !c.rideAgain(ctx, &ride, cause, len(sends)-i) {
			return false
		}
		for j := i; j < len(sends); j++ {
			s := &sends[j]
			var again bool
			if again, s.ok, s.errc = store.SendAgain(j-i, cause == errNoAnswer, s.ok, s.errc); !again {
				continue
			}
			f, err := c.pub.ResendMsgAsync(s.msg)
			if err != nil {
				s.ok, s.errc = store.FailedSend(err)
				continue
			}
			s.ok, s.errc = f.Ok(), f.Err()
		}
	}
	return true
}

// ride is a ride-out of publishes the stream does not answer: when it
// began (zero: none under way) and its rounds so far.
type ride struct {
	started time.Time
	rounds  int
}

// rideAgain is called when n publishes, the oldest first, got cause
// (store.Resendable, or errNoAnswer) for an answer: the first time it
// logs, at WARN, what the controller waits for, then it paces the
// rounds (c.wait) and reports whether to send again: false once ctx
// ended.
func (c *controller) rideAgain(ctx context.Context, r *ride, cause error, n int) bool {
	if r.started.IsZero() {
		r.started = time.Now()
		c.log.Warn("rollout controller: its publishes are unanswered: waiting for "+store.WaitingFor(cause)+"; sending them again until the stream answers",
			"in_flight", n, "err", events.Short(cause.Error()))
	}
	ok := c.wait(ctx, r.rounds)
	r.rounds++
	return ok
}

// answeredAgain ends r, if under way: the stream answered (said at
// INFO, with how long it took).
func (c *controller) answeredAgain(r *ride) {
	if r.started.IsZero() {
		return
	}
	c.log.Info("rollout controller: the stream answers its publishes again", "after", time.Since(r.started).Round(time.Millisecond),
		"rounds", r.rounds)
	*r = ride{}
}

// wait sleeps before retry attempt+1 (100 ms doubling to 5 s) and
// reports whether to retry: false once ctx ended.
func (c *controller) wait(ctx context.Context, attempt int) bool {
	d := min(100*time.Millisecond<<min(attempt, 6), 5*time.Second)
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// lastRecordCause returns the cause of the newest record on the fleet's
// subject (0: none): a record refolded with a cause at or below it was
// appended before.
func (c *controller) lastRecordCause(ctx context.Context) (uint64, error) {
	m, err := c.leader().GetLastMsgForSubject(ctx, c.subj.Rollout(c.fleet, string(rollout.KindRecord)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("rollout controller %s: newest record: %w", c.fleet, err)
	}
	p, err := rollout.Decode(rollout.KindRecord, m.Data)
	if err != nil {
		return 0, nil // a record that does not decode says nothing
	}
	return p.(*rollout.Record).Cause, nil
}
