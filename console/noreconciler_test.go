package console_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/console"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
)

// With no reconciler answering (every one killed), the fleet page says so
// first, marks each row older than its node's events, blames none of them
// for a stale have, and its "as of" says which rows are not as of then
// (a fresh user's findings M9 and m1: the page counted a growing number
// of nodes stale-have, said nothing of reconcilers, and its "as of" was
// when it was drawn). Once a reconciler answers, the page says nothing
// of it any more.
func TestFleetPageWithNoReconciler(t *testing.T) {
	t.Parallel()
	f := newFake()
	healthy(f, "ace")
	healthy(f, "bob")
	// An hour on: every have the page shows is older than its 10 min.
	now := base.Add(time.Hour)
	fx := startWith(t, f, console.Config{Source: f, Now: func() time.Time { return now }})
	fx.waitPage(t, "/", `id="need-ace"`) // stale-have, a reconciler answering

	f.mu.Lock()
	f.noLive = true
	f.mu.Unlock()
	h := f.append("ace", &events.Have{Modules: []events.HaveModule{{Name: "provisioner", Build: "p:1", State: events.Running, Account: "prov"}}})
	body := fx.waitPage(t, "/", `id="noreconciler"`)
	if !strings.Contains(body, `<p class="note noreconciler" id="noreconciler">No reconciler answers since `) ||
		!strings.Contains(body, "1 nodes have events no reconciler has folded") {
		t.Errorf("the page does not say that no reconciler answers:\n%s", body)
	}
	row := regexp.MustCompile(`(?s)<tr id="node-ace".*?</tr>`).FindString(body)
	if !strings.Contains(row, fmt.Sprintf("older than its events (#%d)", h.Seq)) || strings.Contains(row, "need-stale-have") {
		t.Errorf("ace's row, its have #%d unfolded: want it older than its events, no stale-have:\n%s", h.Seq, row)
	}
	if strings.Contains(body, `id="need-ace"`) {
		t.Errorf("ace is listed as needing an operator, for a have no reconciler folded:\n%s", body)
	}
	if !regexp.MustCompile(`<p class="asof">as of [^<]*, but for the rows of 1 nodes, older than their events: no reconciler has folded them \(since `).MatchString(body) {
		t.Errorf("the page's as of does not say which rows are older:\n%s", body)
	}
	// bob, no event past its view, is as it was.
	if row := regexp.MustCompile(`(?s)<tr id="node-bob".*?</tr>`).FindString(body); !strings.Contains(row, "need-stale-have") || strings.Contains(row, "older than its events") {
		t.Errorf("bob's row changed:\n%s", row)
	}

	f.mu.Lock()
	f.noLive = false
	f.mu.Unlock()
	body = waitPageWithout(t, fx, "/", `id="noreconciler"`)
	if strings.Contains(body, "older than its events") || strings.Contains(body, ", but for the rows of") {
		t.Errorf("a reconciler answers again, yet the page still marks rows older than their events:\n%s", body)
	}
}

// waitPageWithout waits until GET path no longer holds s, and returns it.
func waitPageWithout(t *testing.T, fx *fixture, path, s string) string {
	t.Helper()
	return waitfor.Value(t, 20*time.Second, fmt.Sprintf("GET %s not to hold %q", path, s), func() (string, bool) {
		_, body := fx.get(t, path)
		return body, !strings.Contains(body, s)
	})
}
