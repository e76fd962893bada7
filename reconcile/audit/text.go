package audit

import (
	"fmt"
	"strings"
)

// textWriter writes labelled, indented lines clipped to [LineWidth].
type textWriter struct{ b strings.Builder }

func (t *textWriter) line(indent int, label, text string) {
	head := strings.Repeat("  ", indent)
	cont := head + "  "
	if label != "" {
		head += fmt.Sprintf("%-9s", label) + " "
		cont = strings.Repeat(" ", len(head))
	}
	for i, l := range wrap(text, LineWidth-len(head), LineWidth-len(cont)) {
		if i > 0 {
			head = cont
		}
		t.b.WriteString(strings.TrimRight(head+l, " "))
		t.b.WriteByte('\n')
	}
}

// wrap breaks text at spaces into lines of at most first columns, then
// rest columns; a word longer than a line is clipped.
func wrap(text string, first, rest int) []string {
	var out []string
	width := first
	line := ""
	for _, w := range strings.Fields(text) {
		switch {
		case line == "":
			line = w
		case len([]rune(line))+1+len([]rune(w)) <= width:
			line += " " + w
		default:
			out = append(out, Clip(line, width))
			line, width = w, rest
		}
	}
	return append(out, Clip(line, width))
}

func linkText(l *Link) string {
	return fmt.Sprintf("#%d %s (%s): %s", l.Seq, l.Kind, FormatTime(l.Time), l.Summary)
}

// Text returns the explanation as lines of at most [LineWidth] columns:
// the event, then one labelled line per link of the chain.
func (w Why) Text() string {
	var t textWriter
	t.line(0, "", fmt.Sprintf("%s #%d %s (%s): %s", w.Node, w.Event.Seq, w.Event.Kind, FormatTime(w.Event.Time), w.Event.Summary))
	if w.Cause != nil {
		t.line(1, "cause", linkText(w.Cause))
	}
	if w.Rollout != nil {
		t.line(1, "rollout", w.Rollout.Text())
	}
	if w.Want != nil && w.Cause != nil && w.Want.Seq == w.Cause.Seq {
		t.line(1, "want", fmt.Sprintf("the cause, #%d", w.Want.Seq))
	} else if w.Want != nil {
		t.line(1, "want", linkText(w.Want))
	}
	for _, o := range w.Owed {
		t.line(1, "owed", fmt.Sprintf("%s %s (%s, plan %s, writer %s)", o.Module, o.Path, o.Reason, planRef(o.Plan), o.Writer))
		if o.Refusal != nil {
			t.line(2, "refused", linkText(o.Refusal))
		} else {
			t.line(2, "refused", "the refusal is not in the history read")
		}
		t.line(3, "", o.Judged)
		if o.Want != nil {
			t.line(2, "declared", linkText(o.Want))
		}
		if o.Declared != "" {
			t.line(3, "", o.Declared)
		}
		if o.Accepting != nil {
			t.line(2, "accepted", linkText(o.Accepting))
		}
		if o.Settle != nil {
			t.line(2, "settled", linkText(o.Settle))
		}
		t.line(2, "due", o.Due)
	}
	if len(w.Changes) > 0 {
		t.line(1, "changes", strings.Join(w.Changes, "; "))
	}
	for _, r := range w.Rows {
		label := "composed"
		if r.Held {
			label = "held"
		}
		head := r.Module + " " + orNone(r.Build)
		if r.Held {
			head = fmt.Sprintf("%s (%s) carries %s", r.Module, r.Why, orNone(r.Build))
			if r.Pending != "" {
				head += ", pending " + r.Pending
			}
		}
		t.line(1, label, head)
		t.line(3, "", r.Reason)
	}
	if w.Account != "" {
		t.line(1, "account", w.Account)
	}
	for i := range w.Effects {
		t.line(1, "caused", linkText(&w.Effects[i]))
	}
	if w.Fate != "" {
		t.line(1, "fate", w.Fate)
	}
	if w.Replay != "" {
		t.line(1, "replay", w.Replay)
	}
	for _, n := range w.Notes {
		t.line(1, "note", n)
	}
	return t.b.String()
}

// NoteText returns a note (a bound between events, a replay's progress)
// as lines starting with "-- ", wrapped at [LineWidth].
func NoteText(note string) string {
	var b strings.Builder
	for i, l := range wrap(note, LineWidth-3, LineWidth-6) {
		if i == 0 {
			b.WriteString("-- " + l + "\n")
		} else {
			b.WriteString("--    " + l + "\n")
		}
	}
	return b.String()
}
