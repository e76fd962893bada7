package engine

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/meshfold/meshfold/store"
)

// Riding out a leader election (issue 24, docs/architecture.md, "On a
// cluster (R3)"). When the server leading the stream or the snapshot
// bucket crashes, the replicas elect a new leader in seconds, during
// which writes get no answer. A session used to die on its first lost
// acknowledgement and restart after an exponential backoff that had grown
// during the election, so its first plan came seconds after JetStream
// answered again. Now an effect left unanswered is sent again once the
// leaders are back (pubride.go), and a session that ended restarts as
// soon as every leader is back. And the reads: a partition's consumer
// lives on one of the stream's peers (any of them, not the leader), and
// the client noticed its loss only after missed heartbeats and a reset
// attempt that waited out its own timeout (~10 s after a kill here, while
// JetStream answered again after 5–7 s); its tail now ends after two
// missed heartbeats (store.ErrConsumerLost). A watcher also looks at the
// stream's leader every leaderWatch; when a new one is elected, every
// session asks its consumer, and one gone or unanswered reads on from
// the last sequence it folded through a new consumer, its state kept:
// nothing is refolded (readGone). A consumer on a server that still runs
// reads on across the change.

// leaderPoll bounds each look at a stream's leader, and the pause
// between looks grows from electionPollMin to electionPollMax.
const (
	leaderPoll      = 500 * time.Millisecond
	electionPollMin = 50 * time.Millisecond
	electionPollMax = 250 * time.Millisecond
	// electionRideOut bounds a wait for leaders, and how long a snapshot
	// write is tried again across elections before the session gives up
	// (elections here took 4.5–9.8 s).
	electionRideOut = 20 * time.Second
	// leaderWatch is how often the watcher looks at the stream's leader.
	leaderWatch = 250 * time.Millisecond
)

// watchLeaders looks at the stream's leader every leaderWatch until ctx
// is done, and announces each newly elected one ([Reconciler.elected]):
// one that differs from the last one seen, starting from the leader the
// stream was opened under (a leader killed before the first look is then
// noticed too: a kill 60 ms after the start was not). A look that finds
// none (an election, or an answer later than leaderPoll on a loaded
// machine) announces nothing: announcing the same leader again after
// one made every session move to a new consumer every second or two
// under load, and they stopped planning for 30 s
// (TestGroupFailoverOnCluster). A leader that crashed and is elected
// again unseen needs no announcement: the reads its crash took end on
// their own (store.ErrConsumerLost) and are followed again.
func (r *Reconciler) watchLeaders(ctx context.Context) {
	if r.stream == nil {
		return
	}
	info := r.stream.CachedInfo()
	name := info.Config.Name
	last := ""
	if info.Cluster != nil {
		last = info.Cluster.Leader
	}
	t := time.NewTicker(leaderWatch)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		leader := r.leaderOf(ctx, name)
		if leader == "" {
			continue
		}
		if last != "" && leader != last {
			r.log.Info("the stream has a new leader: partitions whose consumer is gone read on through new ones", "leader", leader)
			r.electMu.Lock()
			close(r.electCh)
			r.electCh = make(chan struct{})
			r.electMu.Unlock()
		}
		last = leader
	}
}

// leaderOf returns the name of the server leading stream, "" when its
// info cannot be had within leaderPoll or names none.
func (r *Reconciler) leaderOf(ctx context.Context, stream string) string {
	return store.StreamLeader(ctx, r.js, stream, leaderPoll)
}

// elected returns a channel closed when the stream has a new leader.
func (r *Reconciler) elected() <-chan struct{} {
	r.electMu.Lock()
	defer r.electMu.Unlock()
	return r.electCh
}

// leaderless reports whether the stream or the snapshot bucket has no
// leader now: its info cannot be had within leaderPoll, or names none.
// A server that is not clustered always has one.
func (r *Reconciler) leaderless(ctx context.Context) bool {
	return r.leaderlessWithin(ctx, leaderPoll)
}

// leaderlessWithin is leaderless whose looks are each bounded by poll.
func (r *Reconciler) leaderlessWithin(ctx context.Context, poll time.Duration) bool {
	if r.stream == nil || r.snaps == nil {
		return false
	}
	name := r.stream.CachedInfo().Config.Name
	for _, stream := range []string{name, "KV_" + name + store.SnapshotBucketSuffix} {
		if ctx.Err() != nil {
			return false
		}
		if !r.hasLeader(ctx, stream, poll) && ctx.Err() == nil {
			return true
		}
	}
	return false
}

// hasLeader reports whether stream's info, had within poll, names a
// leader (or the stream is not replicated in a cluster).
func (r *Reconciler) hasLeader(ctx context.Context, stream string, poll time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, poll)
	defer cancel()
	s, err := r.js.Stream(ctx, stream)
	if err != nil {
		return false
	}
	info, err := s.Info(ctx)
	if err != nil {
		return false
	}
	return info.Cluster == nil || info.Cluster.Leader != "" || len(info.Cluster.Replicas) == 0
}

// awaitLeaders waits until the stream and the snapshot bucket have
// leaders (or ctx is done), looking with backoff; it reports whether it
// had to wait.
//
// It waits at most electionRideOut, and not at all on a connection closed
// for good (nothing will answer it again): the caller's own error path
// decides then. Each look after the first is given twice the time of the
// one before, from leaderPoll up to ackTimeout: a look that got no answer
// in time is taken for no leader, and on a loaded machine (load 26 on 2
// cores) a standalone server's stream info took more than 500 ms again
// and again, so a session's restart waited the whole ride-out (20 s) for
// an election that never was (TestCheckpointConflictsWithANewerState).
func (r *Reconciler) awaitLeaders(ctx context.Context) bool {
	if r.js.Conn().IsClosed() || !r.leaderless(ctx) {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, electionRideOut)
	defer cancel()
	started := time.Now()
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(electionPollMin),
		backoff.WithMaxInterval(electionPollMax), backoff.WithMaxElapsedTime(0))
	poll := leaderPoll
	for {
		poll = min(2*poll, ackTimeout)
		if !r.leaderlessWithin(ctx, poll) || r.js.Conn().IsClosed() {
			break
		}
		select {
		case <-ctx.Done():
			return true
		case <-time.After(b.NextBackOff()):
		}
	}
	if ctx.Err() != nil {
		return true // the ride-out's end, or the caller's: no leader seen
	}
	r.log.Info("stream and snapshot bucket have leaders again", "waited", time.Since(started).Round(time.Millisecond))
	return true
}

// A stopping partition rides out no election that cannot come. When the
// stream and the snapshot bucket have one replica each, a leader that is
// gone is a server that is gone: no other replica will be elected, and a
// wait for leaders is a wait for that server's restart. A stop (SIGTERM
// to serve or reconcile against a kill -9'd nats-server) waited out the
// whole ride-out (electionRideOut, 20 s) and an attempt more before it
// gave its final snapshot up: 30 s. So once the partition is stopping
// (its final snapshot being written, or a live write begun before the
// stop), noRideOut holds and a write or read left unanswered is not
// tried again while the connection is down, nor after a refusal or an
// attempt of ackTimeout (retry, rideAgain), and a wait for leaders under
// way ends (awaitLeaders). The partition then stops with its final
// snapshot unwritten (Unsaved): a restart refolds it from the previous
// one, as after any failed final write. A running partition still rides
// out its standalone server's restart (its session restarts once the
// server answers), and with more than one replica a stop still rides out
// an election: it comes in seconds (docs/architecture.md, "On a cluster
// (R3)").

// noRideOut reports whether p is stopping and no election can come
// (neither the stream nor the snapshot bucket is replicated).
func (p *partition) noRideOut() bool {
	if p.r.replicated || p.stopping == nil {
		return false
	}
	select {
	case <-p.stopping:
		return true
	default:
		return false
	}
}

// giveUp reports whether p, stopping with no election to come
// (noRideOut), gives a write or read up after an attempt of attempt that
// got no answer (timedOut: its deadline passed; otherwise refused at
// once, no responders or no leader): when the connection is down (only
// the server's restart would answer), the answer was a refusal, or the
// attempt had ackTimeout. A connected server that was slow to answer
// (a loaded machine) is asked again, each attempt's deadline doubled,
// as before.
func (p *partition) giveUp(timedOut bool, attempt time.Duration) bool {
	return p.noRideOut() && (!p.r.js.Conn().IsConnected() || !timedOut || attempt >= ackTimeout)
}

// awaitLeaders is the reconciler's awaitLeaders for a write or read of
// p: none when p is stopping and no election can come (noRideOut), and
// one under way ends when p stops, unless the stream or the snapshot
// bucket is replicated.
func (p *partition) awaitLeaders(ctx context.Context) bool {
	if p.noRideOut() {
		return false
	}
	if !p.r.replicated && p.stopping != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-p.stopping:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	return p.r.awaitLeaders(ctx)
}
