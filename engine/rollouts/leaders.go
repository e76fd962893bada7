package rollouts

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
)

// leaderPoll is how often a process's controllers read their stream's
// leader (leaders), in nanoseconds: atomic, since a test sets it while a
// controller an earlier test started may still read it (a data race
// under -race, TestFleetsShareOneLeaderWatch).
var leaderPoll atomic.Int64

func init() { leaderPoll.Store(int64(time.Second)) }

// pollEvery returns leaderPoll as a duration.
func pollEvery() time.Duration { return time.Duration(leaderPoll.Load()) }

// leaders reads one stream's leader every leaderPoll for all the
// controllers of a process ([Run]'s fleets), and tells each watcher when
// it changed: one stream info request a second per process, where each
// fleet's controller asked its own (a process running the controllers of
// N fleets asked N a second, for as long as they lived, idle or not). It
// reads only while someone watches.
type leaders struct {
	js     jetstream.JetStream
	stream string

	mu       sync.Mutex
	watchers map[*leaderWatcher]struct{}
	leader   string             // the last read while watched; "" none yet
	stop     context.CancelFunc // the reads' (nil: not reading)
}

// leaderWatcher is one watch of [leaders.watch].
type leaderWatcher struct {
	ch  chan struct{}
	was string // the leader it last knew of; "" none yet
}

func newLeaders(js jetstream.JetStream, stream string) *leaders {
	return &leaders{js: js, stream: stream, watchers: map[*leaderWatcher]struct{}{}}
}

// watch returns a channel that gets a value each time the stream's
// leader, as read every leaderPoll until ctx ends, is another server than
// the one read before: the last read when watch is called, else the first
// read after it. A read that fails or finds no leader is skipped. The
// controller's ordered consumer lives on the leader and dies with it;
// nats.go's own reset of it did not come back within 2 minutes when the
// controller's server was the leader killed with SIGKILL (the controller
// then waited, silent, for a resume it never read:
// TestPausedRolloutResumesAcrossTheStreamLeadersKill), as the
// reconciler's partitions read on through a new consumer when the stream
// has a new leader (engine's watchLeaders).
//
// A watch that finds no leader read yet (the first of the process, or
// one after a moment nobody watched) reads it at once: the caller has
// just made its consumer, and a leader killed before the first poll
// would otherwise be taken for the one it knew (the first read sets it),
// and the election missed: the controller then read nothing through its
// dead consumer until the rollout's deadline (seen in
// TestPausedRolloutResumesAcrossTheStreamLeadersKill, a kill 0.16 s
// after a resume woke the controller). When that read fails, the first
// leader read later counts as a change: a needless new consumer at
// worst.
func (l *leaders) watch(ctx context.Context) <-chan struct{} {
	w := &leaderWatcher{ch: make(chan struct{}, 1)}
	l.mu.Lock()
	w.was = l.leader
	l.watchers[w] = struct{}{}
	if l.stop == nil {
		rctx, stop := context.WithCancel(context.Background())
		l.stop = stop
		go l.read(rctx)
	}
	unread := w.was == ""
	l.mu.Unlock()
	if unread {
		now := l.current(ctx)
		if now == "" {
			now = leaderUnknown
		}
		l.mu.Lock()
		if w.was == "" { // not read by the poll meanwhile
			w.was = now
		}
		l.mu.Unlock()
	}
	context.AfterFunc(ctx, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.watchers, w)
		if len(l.watchers) == 0 && l.stop != nil {
			// Nobody watches: no reads, and the next watch does not
			// start from a leader read long ago.
			l.stop()
			l.stop, l.leader = nil, ""
		}
	})
	return w.ch
}

// read reads the leader every leaderPoll until ctx ends and tells the
// watchers of each change.
func (l *leaders) read(ctx context.Context) {
	t := time.NewTicker(pollEvery())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := l.current(ctx)
		if now == "" {
			continue
		}
		l.mu.Lock()
		if ctx.Err() == nil { // not stopped meanwhile
			l.leader = now
			for w := range l.watchers {
				if w.was != "" && w.was != now {
					select {
					case w.ch <- struct{}{}:
					default:
					}
				}
				w.was = now
			}
		}
		l.mu.Unlock()
	}
}

// leaderUnknown is a watcher's leader when none could be read as it
// began to watch: any leader read later differs from it.
const leaderUnknown = "\x00unknown"

// current reads the stream's leader now, within leaderPoll: "" when the
// read fails or the stream has none.
func (l *leaders) current(ctx context.Context) string {
	return store.StreamLeader(ctx, l.js, l.stream, pollEvery())
}
