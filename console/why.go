package console

import (
	"fmt"
	"strings"

	"github.com/meshfold/meshfold/reconcile/audit"
)

// whyView is an [audit.Why] as the page shows it: the chain the audit
// computed, line by line, each event a link. Nothing is decided here;
// every line is a field of the Why, labelled as `meshfold audit --why`
// labels it.
type whyView struct {
	Why   audit.Why
	Head  linkView
	Lines []whyLine
	// Text is `meshfold audit --why`'s text, for copying.
	Text string
}

type linkView struct {
	audit.Link
	Href string
}

// whyLine is one labelled line; Link, when set, is the event it names.
type whyLine struct {
	Depth int
	Label string
	Link  *linkView
	Text  string
}

func newWhyView(w audit.Why, href func(uint64) string) *whyView {
	v := &whyView{Why: w, Head: linkView{w.Event, href(w.Event.Seq)}, Text: w.Text()}
	link := func(depth int, label string, l *audit.Link) {
		if l == nil {
			return
		}
		v.Lines = append(v.Lines, whyLine{Depth: depth, Label: label, Link: &linkView{*l, href(l.Seq)}})
	}
	text := func(depth int, label, s string) {
		if s != "" {
			v.Lines = append(v.Lines, whyLine{Depth: depth, Label: label, Text: s})
		}
	}
	link(1, "cause", w.Cause)
	if w.Rollout != nil {
		text(1, "rollout", w.Rollout.Text())
	}
	if w.Want != nil && w.Cause != nil && w.Want.Seq == w.Cause.Seq {
		text(1, "want", fmt.Sprintf("the cause, #%d", w.Want.Seq))
	} else {
		link(1, "want", w.Want)
	}
	for _, o := range w.Owed {
		text(1, "owed", fmt.Sprintf("%s %s (%s, plan %s, writer %s)", o.Module, o.Path, o.Reason, planRef(o.Plan), o.Writer))
		if o.Refusal != nil {
			link(2, "refused", o.Refusal)
		} else {
			text(2, "refused", "the refusal is not in the history read")
		}
		text(3, "", o.Judged)
		link(2, "declared", o.Want)
		text(3, "", o.Declared)
		link(2, "accepted", o.Accepting)
		link(2, "settled", o.Settle)
		text(2, "due", o.Due)
	}
	text(1, "changes", strings.Join(w.Changes, "; "))
	for _, r := range w.Rows {
		label, head := "composed", r.Module+" "+orNone(r.Build)
		if r.Held {
			label = "held"
			head = audit.HeldText(r.Module, r.Why, r.Build, r.Pending)
		}
		text(1, label, head)
		text(3, "", r.Reason)
	}
	text(1, "account", w.Account)
	for i := range w.Effects {
		link(1, "caused", &w.Effects[i])
	}
	text(1, "fate", w.Fate)
	text(1, "replay", w.Replay)
	for _, n := range w.Notes {
		text(1, "note", n)
	}
	return v
}

func planRef(seq uint64) string {
	if seq == 0 {
		return "0"
	}
	return fmt.Sprintf("#%d", seq)
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
