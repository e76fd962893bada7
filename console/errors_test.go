package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/console"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
)

// noRollouts is a fake whose stream holds no rollout.
type noRollouts struct{ *fake }

func (noRollouts) RolloutFleets(context.Context) ([]string, error) { return nil, nil }
func (noRollouts) Rollout(context.Context, string) (*rollout.State, error) {
	return nil, feed.ErrNoRollout
}

// A fleet with no rollout, a path the console has no page for, and a
// fleet page asked for a need that is none answer the house error page
// (the console's header, the error, links back), 404, 404 and 400; the
// need's page lists the valid needs, each a link; the live stream of a
// bogus need is refused too.
func TestErrorPages(t *testing.T) {
	f := newFake()
	healthy(f, "ace")
	c, err := console.New(console.Config{Source: noRollouts{f}, Now: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	fx := &fixture{f: f, srv: httptest.NewServer(c)}
	t.Cleanup(func() {
		fx.srv.Close()
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	house := func(path string, code int, body string) {
		t.Helper()
		if !strings.Contains(body, `class="brand"`) || !strings.Contains(body, `<p class="error">`) || !strings.Contains(body, `href="/rollouts"`) {
			t.Errorf("GET %s (%d) is not the house error page:\n%s", path, code, body)
		}
	}
	code, body := fx.get(t, "/rollouts/nofleet")
	if code != http.StatusNotFound || !strings.Contains(body, "fleet nofleet has no rollout") {
		t.Errorf("/rollouts/nofleet: %d\n%s", code, body)
	}
	house("/rollouts/nofleet", code, body)
	code, body = fx.get(t, "/nosuchpage")
	if code != http.StatusNotFound || !strings.Contains(body, "the console has no page /nosuchpage") {
		t.Errorf("/nosuchpage: %d\n%s", code, body)
	}
	house("/nosuchpage", code, body)
	code, body = fx.get(t, "/?need=bogus")
	if code != http.StatusBadRequest || !strings.Contains(body, `need &#34;bogus&#34; is no need the fleet names`) {
		t.Errorf("/?need=bogus: %d\n%s", code, body)
	}
	house("/?need=bogus", code, body)
	for _, n := range audit.FleetNeeds {
		if !strings.Contains(body, `href="/?need=`+n+`"`) {
			t.Errorf("/?need=bogus does not link the need %s:\n%s", n, body)
		}
	}
	if code, _ := fx.get(t, "/events?need=bogus"); code != http.StatusBadRequest {
		t.Errorf("/events?need=bogus: %d, want 400", code)
	}
	if code, body := fx.get(t, "/?need=source"); code != http.StatusOK || !strings.Contains(body, "ace") {
		t.Errorf("/?need=source: %d", code)
	}
}
