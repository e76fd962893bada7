package console_test

import (
	"context"
	"html"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/console"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
)

var _ console.RolloutGoneSource = (*query.Reader)(nil)

// goneRollouts is a fake whose stream holds web's rollout whole, and two
// rollouts whose start aged out: db's before the list was read (a fleet
// without a start), api's between the list and its replay (listed, its
// replay finding no rollout).
type goneRollouts struct {
	*fake
	web    *rollout.State
	remain map[string]feed.Remains
}

func (g goneRollouts) RolloutFleets(context.Context) ([]string, error) {
	return []string{"api", "web"}, nil
}

func (g goneRollouts) Rollout(_ context.Context, fleet string) (*rollout.State, error) {
	if fleet == "web" {
		return g.web, nil
	}
	return nil, feed.ErrNoRollout
}

func (g goneRollouts) RolloutFleetsWithoutStart(context.Context) ([]string, error) {
	return []string{"db"}, nil
}

func (g goneRollouts) RolloutRemains(_ context.Context, fleet string) (feed.Remains, error) {
	return g.remain[fleet], nil
}

// The rollouts page lists a fleet whose rollout's start aged out of the
// stream (--max-age shorter than the rollout) as `rollout ls` does: a
// row "start gone", STARTED before the stream's first event, and the
// same line under the table; it left such a fleet out. The fleet's page
// says what `rollout status` says, with the events that remain, not "a
// mistyped name?".
func TestRolloutsPageListsAStartGone(t *testing.T) {
	t.Parallel()
	f := newFake()
	begins := time.Date(2026, 12, 5, 4, 58, 39, 0, time.UTC)
	remain := func(id uint64, lines ...string) feed.Remains {
		return feed.Remains{First: 23, FirstTime: begins, MaxAge: 30 * time.Second, ID: id, N: len(lines) + 4, From: id + 10, To: id + 20, Lines: lines}
	}
	src := goneRollouts{fake: f, web: revertStalled(t), remain: map[string]feed.Remains{
		"db":  remain(13, "#33 2026-12-05T04:59:00Z record: completed: rollout 13 completed: 2 targets done, 0 unreached"),
		"api": remain(9, "#30 2026-12-05T04:58:50Z record ace: done: ace done", "(and 4 ticks: the controller's clock)"),
	}}
	c, err := console.New(console.Config{Source: src, Now: time.Now})
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
	code, raw := fx.get(t, "/rollouts")
	if code != http.StatusOK {
		t.Fatalf("/rollouts: %d\n%s", code, raw)
	}
	body := html.UnescapeString(raw)
	for _, want := range []string{
		`<tr id="rollout-db" class="gone"><td><a href="/rollouts/db">db</a></td><td>13</td><td class="phase">start gone</td><td>-</td><td>-</td><td>-</td><td>before 2026-12-05T04:58:39Z</td></tr>`,
		`<tr id="rollout-api" class="gone"><td><a href="/rollouts/api">api</a></td><td>9</td><td class="phase">start gone</td>`,
		`<tr id="rollout-web"><td><a href="/rollouts/web">web</a></td><td>3</td>`,
		`<p class="note start-gone">start gone: fleet db's rollout 13: its start (#13) is gone from the stream, which keeps 30s of events (--max-age) and begins at #23 (2026-12-05T04:58:39Z); ` +
			`the newest of its events that remain: #33 2026-12-05T04:59:00Z record: completed: rollout 13 completed: 2 targets done, 0 unreached ('meshfold rollout status db' lists the 5 events of it that remain)</p>`,
		`<p class="note start-gone">start gone: fleet api's rollout 9: its start (#9) is gone from the stream, which keeps 30s of events (--max-age) and begins at #23 (2026-12-05T04:58:39Z); ` +
			`the newest of its events that remain: #30 2026-12-05T04:58:50Z record ace: done: ace done ('meshfold rollout status api' lists the 6 events of it that remain)</p>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/rollouts lacks %q:\n%s", want, body)
		}
	}
	if a, d, w := strings.Index(body, `id="rollout-api"`), strings.Index(body, `id="rollout-db"`), strings.Index(body, `id="rollout-web"`); !(a < d && d < w) {
		t.Errorf("/rollouts rows at %d (api), %d (db), %d (web): want them by fleet, as 'rollout ls'", a, d, w)
	}
	if strings.Contains(body, `class="error"`) {
		t.Errorf("/rollouts says an error:\n%s", body)
	}

	code, raw = fx.get(t, "/rollouts/db")
	body = html.UnescapeString(raw)
	if code != http.StatusGone {
		t.Errorf("/rollouts/db: %d, want %d (its start gone)\n%s", code, http.StatusGone, body)
	}
	for _, want := range []string{
		`fleet db's rollout 13: its start (#13) is gone from the stream, which keeps 30s of events (--max-age) and begins at #23 (2026-12-05T04:58:39Z): ` +
			`its view needs the start (its targets, batches and wants) and cannot be replayed; 5 events of it remain (#23 to #33)`,
		`<li><code>#33 2026-12-05T04:59:00Z record: completed: rollout 13 completed: 2 targets done, 0 unreached</code></li>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/rollouts/db lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "mistyped") {
		t.Errorf("/rollouts/db calls db a mistyped name:\n%s", body)
	}
}
