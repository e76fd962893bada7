package node

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// An agent whose stream does not answer at its start (here: not created
// yet; in the field a cluster without a quorum, an in-place upgrade
// during an outage) asks for it again until it answers, saying so, and
// then runs: it ended on the first unanswered ask, 28 s after taking its
// lease, and its node stayed down (a fresh user's finding M6).
func TestAgentWaitsForItsStream(t *testing.T) {
	_, nc, js := storetest.Start(t)
	cfg := store.StreamConfig{}.WithDefaults()
	e := &env{nc: nc, js: js, cfg: cfg, pub: store.NewPublisher(js, cfg.Subjects())}
	dir := t.TempDir()
	a := e.startAgentIn(t, "ace", filepath.Join(dir, "root"), filepath.Join(dir, "state"), nil)
	waitfor.Until(t, wait, "the agent saying it asks for its stream again", func() bool {
		return strings.Contains(a.logs.String(), "look up stream MESH failed; retrying")
	})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	stream, _, err := store.EnsureStream(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.stream = stream
	e.waitEvent(t, "ace", events.KindHave, func(store.Msg) bool { return true })
}
