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
	t.Parallel()
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
	for _, n := range append(audit.FleetNeeds[:len(audit.FleetNeeds):len(audit.FleetNeeds)], audit.NeedNothing) {
		if !strings.Contains(body, `href="/?need=`+n+`"`) {
			t.Errorf("/?need=bogus does not link the need %s:\n%s", n, body)
		}
	}
	if code, body := fx.get(t, "/events?need=bogus"); code != http.StatusBadRequest {
		t.Errorf("/events?need=bogus: %d, want 400", code)
	} else {
		house("/events?need=bogus", code, body)
	}
	// Every 400 is the house page with a way back: the same page without
	// the parameter that is wrong, or the fleet (a fresh user's finding:
	// they were net/http's bare text).
	for _, c := range []struct{ path, says, back string }{
		{"/node/ace?why=abc", `why: &#34;abc&#34; is not a stream sequence`, `href="/node/ace"`},
		{"/node/ace?why=0&axis=time", `why: &#34;0&#34; is not a stream sequence`, `href="/node/ace?axis=time"`},
		{"/node/ace?from=garbage&to=5", "from: ", `href="/node/ace?to=5"`},
		{"/node/ace?to=garbage", "to: ", `href="/node/ace"`},
		{"/node/ace?as_of=garbage", "as_of: ", `href="/node/ace"`},
		{"/node/Not_A_Node!", `node &#34;Not_A_Node!&#34;`, `class="back" href="/"`},
		{"/node/ace/events?after=x", `after: &#34;x&#34; is not a stream sequence`, `href="/node/ace"`},
		{"/node/Bad!/events?after=1", `node &#34;Bad!&#34;`, `class="back" href="/"`},
		// An inverted window and an axis the page does not draw are
		// said, not drawn as nothing or by sequence (a fresh user's
		// finding U24); the way back is the window the other way round.
		{"/node/ace?from=400&to=300", "from 400 is after to 300: the range is inverted", `href="/node/ace?from=300&amp;to=400"`},
		{"/node/ace?from=2026-12-04T15:50:00Z&to=2026-12-04T15:40:00Z", "the range is inverted", `href="/node/ace?from=2026-12-04T15%3A40%3A00Z&amp;to=2026-12-04T15%3A50%3A00Z"`},
		{"/node/ace?axis=banana&from=3", `axis: &#34;banana&#34; is no axis: want seq (the default) or time`, `href="/node/ace?from=3"`},
		// The fleet page's parameters (a fresh user's finding V6: they
		// were ignored or clamped, 200).
		{"/?page=abc", `page: &#34;abc&#34; is not a page number`, `class="back" href="/"`},
		{"/?page=-1&q=ac", `page: &#34;-1&#34; is not a page number`, `href="/?q=ac"`},
		{"/?page=0", `page: &#34;0&#34; is not a page number`, `class="back" href="/"`},
		{"/?page=1e9", `page: &#34;1e9&#34; is not a page number`, `class="back" href="/"`},
		{"/?npage=x&need=source", `npage: &#34;x&#34; is not a page number`, `href="/?need=source"`},
		{"/?all=maybe", `all: &#34;maybe&#34; is neither 1`, `class="back" href="/"`},
		{"/events?page=abc", `page: &#34;abc&#34; is not a page number`, `class="back" href="/"`},
	} {
		code, body := fx.get(t, c.path)
		if code != http.StatusBadRequest || !strings.Contains(body, c.says) || !strings.Contains(body, `class="back"`) || !strings.Contains(body, c.back) {
			t.Errorf("GET %s: %d, want 400 saying %q with a way back %s:\n%s", c.path, code, c.says, c.back, body)
		}
		house(c.path, code, body)
	}
	for _, path := range []string{"/node/ace?from=3&to=3", "/node/ace?axis=seq", "/node/ace?axis=time",
		"/node/ace?from=2026-12-04T15:50:00Z&to=2026-12-04T15:50:00Z"} {
		if code, body := fx.get(t, path); code != http.StatusOK {
			t.Errorf("GET %s: %d, want 200:\n%s", path, code, body)
		}
	}
	if code, body := fx.get(t, "/?need=source"); code != http.StatusOK || !strings.Contains(body, "ace") {
		t.Errorf("/?need=source: %d", code)
	}
	for _, path := range []string{"/?all=1", "/?all=0", "/?page=1&npage=1"} {
		if code, _ := fx.get(t, path); code != http.StatusOK {
			t.Errorf("GET %s: %d, want 200", path, code)
		}
	}
	// A way back to the fleet is linked once, not as "← the fleet" and
	// "the fleet" again (a fresh user's finding V6).
	if _, body := fx.get(t, "/node/Ace!"); strings.Count(body, `href="/"`) != 2 { // the header's brand, and the way back
		t.Errorf("/node/Ace! links the fleet %d times, want the header's and one way back:\n%s", strings.Count(body, `href="/"`), body)
	}
}
