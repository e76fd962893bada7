package feed_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/rollout/fleetfile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// askedStream is a stream that records the subjects of its last-message
// reads (the direct gets Candidates makes).
type askedStream struct {
	jetstream.Stream
	mu    sync.Mutex
	asked []string
}

func (s *askedStream) GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	s.mu.Lock()
	s.asked = append(s.asked, subject)
	s.mu.Unlock()
	return s.Stream.GetLastMsgForSubject(ctx, subject)
}

// With WithLeaderWants, Candidates reads each node's newest want from the
// stream's leader (its expectation, Candidate.Prev: a replica behind the
// leader answers an older want, and the step is refused as a conflict),
// and no longer with a direct get; its other reads stay direct gets. The
// want read still finds the node's want.
func TestCandidatesReadTheWantFromTheLeader(t *testing.T) {
	_, _, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subj := cfg.Subjects()
	ack, err := store.NewPublisher(js, subj).Append(ctx, "ace", events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "web", Build: "web:1"}}}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	f, _, err := fleetfile.Parse([]byte("fleet: web\nnodes:\n  ace: {}\ngroups: [{name: all, select: {}, modules: [{name: web, build: \"web:2\"}]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	direct := &askedStream{Stream: stream}
	cands, err := feed.Candidates(ctx, feed.WithLeaderWants(direct, js), subj, f)
	if err != nil {
		t.Fatal(err)
	}
	if len(cands) != 1 || cands[0].Prev != ack.Seq {
		t.Fatalf("candidates %+v, want ace's want #%d as its Prev", cands, ack.Seq)
	}
	wantSubj := subj.Stored("ace", events.KindWant)
	direct.mu.Lock()
	defer direct.mu.Unlock()
	if len(direct.asked) == 0 {
		t.Fatal("no read went through the stream's direct gets")
	}
	for _, s := range direct.asked {
		if s == wantSubj || strings.HasSuffix(s, ".want") {
			t.Errorf("the want was read with a direct get (%s), not from the leader", s)
		}
	}
}
