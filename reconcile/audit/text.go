package audit

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/meshfold/meshfold/events"
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

// whyKeep and whyTail are [cutWhy]'s budget: a why of at most whyKeep
// bytes is kept whole; a longer one keeps about its first whyKeep-whyTail
// bytes, where the provisioner puts the reason that names the state, and
// its last whyTail, where what to do usually is (events.ErrorText's).
const (
	whyKeep = 200
	whyTail = 120
)

// cutWhy returns the why of a file of node for a line of the fleet's
// (`meshfold fleet`, the console's fleet page): whole when at most
// whyKeep bytes, else its head and its tail, each ending or starting
// between words, joined by " … ", then its length and where it is whole:
// "(276 bytes; whole in 'meshfold state ace')". A text with a control
// character is quoted first (events.Plain). events.ErrorText, which cut
// it before, cuts at a byte count: "(the --from or…7:54Z is not what" (a
// fresh user's finding L4).
func cutWhy(node, why string) string {
	return cutText(why, whyKeep, whyTail, "meshfold state "+node)
}

// cutText is [cutWhy]'s rule with its budget and its pointer given: s
// whole when at most keep bytes, else about its first keep-tail bytes and
// its last tail, cut between words, joined by " … ", then its length and
// where it is whole: "(N bytes; whole in 'WHOLE')".
func cutText(text string, keep, tail int, whole string) string {
	s := events.Plain(text)
	if len(s) <= keep {
		return s
	}
	head, end := s[:runeStart(s, keep-tail)], s[runeStart(s, len(s)-tail):]
	// The head ends, and the tail starts, at a space: the word cut in
	// two is left out, unless the head (or tail) is one word.
	if s[len(head)] != ' ' {
		if i := strings.LastIndexByte(head, ' '); i > 0 {
			head = head[:i]
		}
	}
	if s[len(s)-len(end)-1] != ' ' {
		if i := strings.IndexByte(end, ' '); i >= 0 && i < len(end)-1 {
			end = end[i+1:]
		}
	}
	return strings.TrimRight(head, " ") + " … " + strings.TrimLeft(end, " ") +
		" (" + strconv.Itoa(len(text)) + " bytes; whole in '" + whole + "')"
}

// runeStart returns the largest index of s at most n where a rune
// starts (0 ≤ n < len(s)).
func runeStart(s string, n int) int {
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return n
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
			head = HeldText(r.Module, r.Why, r.Build, r.Pending)
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
