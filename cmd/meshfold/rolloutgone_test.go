package main

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/console"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A reviewer's finding: with --max-age shorter than a rollout, its start
// aged out of the stream while its records, outcomes and ticks remained
// (the rollout still running), and 'rollout status' said "no rollout of
// fleet web" (exit 2, a mistyped name), 'why' and the verbs too. Now
// each names the rollout, says its start is gone and why (what the
// stream keeps, where it begins), lists what remains, and exits 1; once
// nothing of it remains, "no rollout" says a rollout started before the
// stream's beginning is gone from it. 'rollout ls' lists the rollout,
// its start gone, until then. The stream's dropping is a purge
// here: what --max-age does, at a moment the test chooses.
func TestRolloutReadsAfterTheStartAgedOut(t *testing.T) {
	t.Parallel()
	e, nc, js, stream, cfg := storetest.StartStream(t, store.StreamConfig{MaxAge: time.Hour})
	m := &mesh{e: e, nc: nc, js: js, cfg: cfg}
	ctx := testCtx(t)
	subj := cfg.Subjects()
	ack, err := js.Publish(ctx, subj.Rollout("web", string(rollout.KindStart)), []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	id := ack.Sequence
	pub := func(k rollout.Kind, p any) uint64 {
		t.Helper()
		seq, err := feed.Publish(ctx, js, subj, "web", k, p, "")
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	pub(rollout.KindRecord, &rollout.Record{Rollout: id, Cause: id, What: "batch", Level: events.LevelInfo, Msg: "batch 1 of 2 begun: ace"})
	pub(rollout.KindPublished, &rollout.Published{Rollout: id, Node: "ace", Step: rollout.StepForward, Want: 40})
	pub(rollout.KindTick, &rollout.Tick{Rollout: id})
	last := pub(rollout.KindRecord, &rollout.Record{Rollout: id, Cause: id + 2, Node: "ace", What: string(rollout.Done), Level: events.LevelInfo, Msg: "ace done"})
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(id+1)); err != nil {
		t.Fatal(err)
	}

	gone := fmt.Sprintf("fleet web's rollout %d: its start (#%d) is gone from the stream, which keeps 1h0m0s of events (--max-age) and begins at #%d", id, id, id+1)
	for _, args := range [][]string{{"rollout", "status", "web"}, {"rollout", "why", "web", "ace"}, {"rollout", "pause", "web", "--by", "alice"}} {
		out, errs, code := m.cli(t, args...)
		if code != exitError || !strings.Contains(errs, gone) || !strings.Contains(errs, "4 events of it remain") {
			t.Errorf("%v: exit %d, want %d saying %q:\n%s%s", args, code, exitError, gone, out, errs)
		}
		remains := out
		if args[1] == "pause" {
			remains = errs
		}
		for _, want := range []string{"record: batch: batch 1 of 2 begun: ace", "published: ace's forward want stored at #40",
			fmt.Sprintf("#%d ", last), "record ace: done: ace done", "(and 1 tick: the controller's clock)"} {
			if !strings.Contains(remains, want) {
				t.Errorf("%v: what remains does not say %q:\n%s", args, want, remains)
			}
		}
	}
	if _, errs, code := m.cli(t, "rollout", "status", "web", "-o", "json"); code != exitError || !strings.Contains(errs, gone) {
		t.Errorf("status -o json: exit %d:\n%s", code, errs)
	}
	// ls lists it (issue 27: it left the fleet out): its row says the
	// start is gone, and a line under the table what remains.
	out, errs, code := m.cli(t, "rollout", "ls")
	var row []string
	for l := range strings.Lines(out) {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "web" {
			row = f
		}
	}
	if code != exitOK || len(row) < 8 || row[1] != fmt.Sprint(id) || row[2] != "start" || row[3] != "gone" {
		t.Errorf("ls: exit %d, want a row 'web %d start gone …':\n%s%s", code, id, out, errs)
	}
	note := fmt.Sprintf("start gone: fleet web's rollout %d: its start (#%d) is gone from the stream, which keeps 1h0m0s of events (--max-age) and begins at #%d", id, id, id+1)
	for _, want := range []string{note, fmt.Sprintf("the newest of its events that remain: #%d ", last), "record ace: done: ace done",
		"'meshfold rollout status web' lists the 4 events of it that remain"} {
		if !strings.Contains(out, want) {
			t.Errorf("ls does not say %q:\n%s", want, out)
		}
	}
	out, errs, code = m.cli(t, "rollout", "ls", "-o", "json")
	var rows []struct {
		Fleet     string
		Rollout   uint64
		Phase     string
		StartGone *struct {
			StreamBegins uint64 `json:"stream_begins"`
			StreamKeeps  string `json:"stream_keeps"`
			Events       int
			Newest       string
		} `json:"start_gone"`
	}
	if err := json.Unmarshal([]byte(out), &rows); code != exitOK || err != nil || len(rows) != 1 || strings.Contains(out, `"started"`) {
		t.Fatalf("ls -o json: exit %d, %v, want one row, no zero view's start:\n%s%s", code, err, out, errs)
	}
	if r := rows[0]; r.Fleet != "web" || r.Rollout != id || r.Phase != "" || r.StartGone == nil || r.StartGone.StreamBegins != id+1 ||
		r.StartGone.StreamKeeps != "1h0m0s of events (--max-age)" || r.StartGone.Events != 4 || !strings.HasPrefix(r.StartGone.Newest, fmt.Sprintf("#%d ", last)) {
		t.Errorf("ls -o json: %+v %+v", r, r.StartGone)
	}

	// The console's rollouts page lists it too, in ls's words (it left
	// the fleet out), and its page of the fleet says what status says
	// (it said "a mistyped name?").
	r, err := query.New(nc, query.Config{Stream: cfg})
	if err != nil {
		t.Fatal(err)
	}
	c, err := console.New(console.Config{Source: r})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	defer srv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, html.UnescapeString(string(b))
	}
	code, page := get("/rollouts")
	for _, want := range []string{fmt.Sprintf(`<td><a href="/rollouts/web">web</a></td><td>%d</td><td class="phase">start gone</td>`, id), note,
		fmt.Sprintf("the newest of its events that remain: #%d ", last), "'meshfold rollout status web' lists the 4 events of it that remain"} {
		if code != http.StatusOK || !strings.Contains(page, want) {
			t.Errorf("console /rollouts: %d, want it to say %q:\n%s", code, want, page)
		}
	}
	code, page = get("/rollouts/web")
	if code != http.StatusGone || !strings.Contains(page, gone) || !strings.Contains(page, "record ace: done: ace done") {
		t.Errorf("console /rollouts/web: %d, want %d saying %q and what remains:\n%s", code, http.StatusGone, gone, page)
	}

	// Nothing of it left.
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(last+1)); err != nil {
		t.Fatal(err)
	}
	out, errs, code = m.cli(t, "rollout", "status", "web")
	if want := fmt.Sprintf("no rollout of fleet \"web\" in the stream, which keeps 1h0m0s of events (--max-age) and begins at #%d", last+1); code != exitUsage ||
		!strings.Contains(errs, want) || !strings.Contains(errs, "a rollout started before that is gone from it") {
		t.Errorf("status with nothing left: exit %d, want %d saying %q:\n%s%s", code, exitUsage, want, out, errs)
	}
	if out, errs, code := m.cli(t, "rollout", "ls", "-o", "json"); code != exitOK || strings.TrimSpace(out) != "[]" {
		t.Errorf("ls -o json with nothing left: exit %d, want []:\n%s%s", code, out, errs)
	}
}
