package rollouts

import (
	"context"
	"testing"
	"time"

	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A watch begun just before the stream's leader changes, before the
// process's first poll, is told of the change: it reads the leader as it
// begins. Before, the first poll's leader (already the new one) was
// taken for the one the watcher knew, the election was missed, and a
// controller whose consumer died with the old leader read nothing until
// its rollout's deadline (TestPausedRolloutResumesAcrossTheStreamLeadersKill,
// a kill 0.16 s after a resume woke the controller).
func TestAWatchBegunJustBeforeAnElectionIsToldOfIt(t *testing.T) {
	// Not parallel: it sets leaderPoll, every controller's.
	c, nc, js, _, cfg := storetest.StartClusterStream(t, 3, store.StreamConfig{Replicas: 3})
	defer SetLeaderPoll(3 * time.Second)() // the stepdown comes before the first poll
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A stream just created elects its leader (1 of 2 race runs under
	// load 30 found none yet, when this asked once).
	waitfor.Until(t, 30*time.Second, "the stream's leader", func() bool { return c.StreamLeader(cfg.Name) != nil })
	l := newLeaders(js, cfg.Name)
	elected := l.watch(ctx)
	from, to := c.StepDown(nc, cfg.Name)
	t.Logf("stepped down: %s → %s", from.Name(), to.Name())
	select {
	case <-elected:
	case <-time.After(20 * time.Second):
		t.Fatal("the watch was not told of the new leader within 20 s")
	}
}
