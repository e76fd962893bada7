package console_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/meshfold/meshfold/console"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/store/storetest"
)

// silentStream is a fake whose stream may stop answering
// (console.StreamChecker).
type silentStream struct {
	*fake
	mu     sync.Mutex
	silent error
}

func (s *silentStream) StreamAnswers(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.silent
}

func (s *silentStream) set(err error) {
	s.mu.Lock()
	s.silent = err
	s.mu.Unlock()
}

// A console whose stream stops answering (a cluster that lost its
// quorum) says so on its fleet page, and that what it shows is as of the
// last event it saw: never "Nothing needs an operator" as of now (a fresh
// user's finding M2: the page said so, with the request's time, while the
// stream had no leader). Once the stream answers again, the page is as of
// now again. Without the watch the page keeps saying "Nothing needs an
// operator" throughout.
func TestFleetPageSaysTheStreamDoesNotAnswer(t *testing.T) {
	t.Parallel()
	f := newFake()
	f.append("ace", &events.Want{Modules: []events.WantModule{provisioner}})
	f.append("ace", &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: f.lastPlan("ace")})
	last := f.append("ace", &events.Have{Modules: []events.HaveModule{{Name: "provisioner", Build: "p:1", State: events.Running, Account: "prov"}}})
	src := &silentStream{fake: f}
	logged := &storetest.SyncBuffer{}
	fx := startWith(t, f, console.Config{Source: src, Logger: slog.New(slog.NewTextHandler(logged, nil))})
	fx.waitPage(t, "/", "Nothing needs an operator")

	src.set(fmt.Errorf("%w: stream MESH has no leader", query.ErrStreamSilent))
	body := fx.waitPage(t, "/", "The stream does not answer since")
	if !strings.Contains(body, "stream MESH has no leader") || !strings.Contains(body, fmt.Sprintf("#%d stored at", last.Seq)) {
		t.Errorf("the page does not say why or as of which event:\n%s", body)
	}
	if strings.Contains(body, "Nothing needs an operator") {
		t.Errorf("the page says nothing needs an operator while the stream does not answer:\n%s", body)
	}
	if !strings.Contains(logged.String(), "the stream does not answer") {
		t.Errorf("the console's log does not say the stream stopped answering:\n%s", logged.String())
	}

	src.set(nil)
	body = fx.waitPage(t, "/", "Nothing needs an operator")
	if strings.Contains(body, "does not answer") {
		t.Errorf("the page still says the stream does not answer once it does:\n%s", body)
	}
}
