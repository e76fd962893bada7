package rollouts

import "time"

// SetLeaderPoll sets how often the stream's leader is read, until the
// returned restore.
func SetLeaderPoll(d time.Duration) (restore func()) {
	was := leaderPoll
	leaderPoll = d
	return func() { leaderPoll = was }
}
