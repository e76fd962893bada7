package rollouts

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
)

// SetLeaderPoll sets how often the stream's leader is read, until the
// returned restore.
func SetLeaderPoll(d time.Duration) (restore func()) {
	was := leaderPoll.Swap(int64(d))
	return func() { leaderPoll.Store(was) }
}

// SetFollowTail sets the controller's consumer creation (store.Follow),
// until the returned restore.
func SetFollowTail(f func(context.Context, jetstream.JetStream, store.TailConfig) (*store.Tail, error)) (restore func()) {
	was := followTail
	followTail = f
	return func() { followTail = was }
}
