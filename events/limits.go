package events

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits of DESIGN.md §10. Every valid event must fold, and every effect
// and snapshot it causes must fit in one message of the server's default
// max_payload (1 MiB), or one node could stop its whole partition. The
// numbers bound what a node's state can hold; reconcile bounds the rest
// (its owed items, filled marks, accepting records, approvals, waivers
// and unsettled plans, see reconcile.MaxOwed and its neighbours). With all
// of them at their maximum, a plan encodes to 51 KB and a node's state to
// 770 KB, its have's runtime fields, crash records, agent and pause at their longest (TestLargestFits in
// store builds both and publishes them): a twentieth and under three quarters
// of the default max_payload.
const (
	// MaxEventBytes bounds an encoded event. The largest valid want is
	// about 30 KB and the largest plan 51 KB; anything much bigger is
	// not an event of this schema, and is refused before it is parsed.
	MaxEventBytes = 256 << 10

	// MaxName is the length of node and module names: the pattern
	// [a-z0-9][a-z0-9_-]{0,62} of DESIGN.md §3 (a DNS label).
	MaxName = 63
	// MaxBuild bounds a build: "sha256:" and 64 hex digits is 71 bytes; an
	// image reference with a registry, a path and a digest fits in 128.
	MaxBuild = 128
	// MaxAccount bounds an account (runs_as, a have's account, the plan's
	// provisioner account, a refusal's writer): Linux's useradd refuses
	// user names longer than 32.
	MaxAccount = 32
	// MaxPath bounds a filled file's path. Credential paths are short
	// (/run/mesh-build-go/broker.creds is 31 bytes); 128 leaves room for
	// deep trees while the state, which keeps a path in several records
	// (accepting, filled, owed), stays bounded.
	MaxPath = 128
	// MaxBy bounds an operator's name (approve's and the operator events'
	// `by`): an identity, not a sentence.
	MaxBy = 64
	// MaxDigest bounds a filled's digest: hex HMAC-SHA256 is 64 bytes.
	MaxDigest = 128
	// MaxText bounds free text from a publisher: a settle's or refusal's
	// error, an operator's reason. An error longer than a kilobyte is a
	// stack trace or a file's content; the node agent cuts its own (see
	// [Cut]) before publishing.
	MaxText = 1024
	// MaxJournal bounds a journal entry's message. The reconciler quotes
	// values through [Short], so its entries stay far below.
	MaxJournal = 4096

	// MaxModules bounds the modules of a want, a plan and a have. A plan
	// row carries up to MaxFilesPerModule files: 32 rows is what keeps a
	// plan at 51 KB, and a node's state (which holds up to six plans, see
	// reconcile.MaxUnsettled) near 300 KB of plans.
	MaxModules = 32
	// MaxHaveModules bounds a have's modules: what runs may still include
	// modules a previous want placed.
	MaxHaveModules = 2 * MaxModules
	// MaxFilesPerModule bounds a module's filled files (a key, a
	// certificate, a CA, a few credentials). A held plan row carries the
	// files of what runs, which the same bound held, so a plan never has
	// more than MaxModules×MaxFilesPerModule files, whatever the history.
	MaxFilesPerModule = 8
	// MaxFilesPerWant bounds a want's filled files.
	MaxFilesPerWant = 128
	// MaxHaveMissing bounds a have's missing files: they are files of
	// the agent's settled plan, which never has more than
	// MaxModules×MaxFilesPerModule.
	MaxHaveMissing = MaxModules * MaxFilesPerModule
	// MaxOwedPerKnock bounds a knock's owed items: the state keeps at
	// most that many (reconcile.MaxOwed).
	MaxOwedPerKnock = 128
)

// ReservedDir is the directory under a node's root that belongs to the
// node agent (its runtime's records). A want may not declare a file in
// it, and the agent refuses fill requests for one as write-failed.
const ReservedDir = "/.meshfold"

// InReserved reports whether the absolute path p is ReservedDir or inside
// it.
func InReserved(p string) bool {
	return p == ReservedDir || strings.HasPrefix(p, ReservedDir+"/")
}

// ValidAccount reports whether s is a Unix user name as accounts are
// written: [a-z_][a-z0-9_-]{0,31} (the pattern of useradd's NAME_REGEX,
// without the trailing $ of machine accounts).
func ValidAccount(s string) bool {
	if len(s) == 0 || len(s) > MaxAccount {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c == '_':
		case (c >= '0' && c <= '9') || c == '-':
			if i == 0 {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// HasControl reports whether s holds a control character (C0, DEL or C1),
// a newline included, or is not valid UTF-8. Such a value could forge a
// line of a log, a timeline or a terminal: validation refuses it in names,
// builds, accounts, paths and identities.
func HasControl(s string) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return true
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			return true
		}
		if r >= 0x80 && r < 0xa0 || r == 0x2028 || r == 0x2029 {
			return true
		}
		i += n
	}
	return false
}

// shortKeep is how many bytes of a long value [Short] and [Cut] keep.
const shortKeep = 64

// Short returns s quoted (Go syntax, every control character escaped) for
// a journal entry, a log line, an error or a timeline line, and cut when
// it is long: the first 64 bytes and its full length, as in
// `"/run/aaaa…" (270000 bytes)`. It is the one way meshfold shows a value
// it did not write itself (DESIGN.md §10).
func Short(s string) string {
	if len(s) <= shortKeep+16 {
		return strconv.Quote(s)
	}
	return strconv.Quote(prefix(s, shortKeep)+"…") + " (" + strconv.Itoa(len(s)) + " bytes)"
}

// Text returns free text (an error, a reason) for a line: as it is when
// it is short and holds no control character, else through [Short]. It
// keeps a plain message readable and a hostile one harmless.
func Text(s string) string {
	if len(s) <= shortKeep+16 && !HasControl(s) {
		return s
	}
	return Short(s)
}

// errKeep is the budget of [ErrorText]: an error's cause is often at its
// end ("…: push it with meshfold build push"), so an error keeps more
// than a value, and its tail.
const (
	errKeep = 200
	errTail = 120
)

// ErrorText returns an error's text (a settle's or refusal's error, a
// journal message) for a line: as it is when it is at most 200 bytes and
// holds no control character; else quoted (Go syntax, as [Short]) and, when
// longer than 200 bytes, cut in the middle, keeping its first 80 bytes and
// its last 120, where the cause usually is, and its full length:
// `"apply x: bundle sha256:…no such bundle: push it with meshfold build push" (1024 bytes)`.
func ErrorText(s string) string {
	if len(s) <= errKeep {
		if HasControl(s) {
			return strconv.Quote(s)
		}
		return s
	}
	return strconv.Quote(prefix(s, errKeep-errTail)+"…"+suffix(s, errTail)) + " (" + strconv.Itoa(len(s)) + " bytes)"
}

// Plain returns s as it is when it holds no control character, else
// quoted; it never cuts. It is for what a user wrote and is shown back
// to them (an error about their own file), where every byte may matter.
func Plain(s string) string {
	if HasControl(s) {
		return strconv.Quote(s)
	}
	return s
}

// Cut returns s unquoted, cut to at most max bytes (at a UTF-8 boundary)
// with "… (N bytes)" appended when it was longer. Publishers use it on
// their own free text (an apply's error) so that it stays within
// [MaxText]. max must leave room for the suffix (at least 32).
func Cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	suffix := "… (" + strconv.Itoa(len(s)) + " bytes)"
	return prefix(s, max-len(suffix)) + suffix
}

// CutMiddle is [Cut] for an error, whose cause is at its end ("…: no
// space left on device"): s unquoted, cut to at most max bytes (at UTF-8
// boundaries), keeping about a third of the room at its head and the rest
// at its tail, joined by "…", with " (N bytes)" appended when it was
// longer. max must leave room for the suffix (at least 32).
func CutMiddle(s string, max int) string {
	if len(s) <= max {
		return s
	}
	count := " (" + strconv.Itoa(len(s)) + " bytes)"
	room := max - len(count) - len("…")
	head := prefix(s, room/3)
	return head + "…" + suffix(s, room-len(head)) + count
}

// prefix returns the longest prefix of s of at most n bytes that ends at
// a rune boundary.
func prefix(s string, n int) string {
	if n >= len(s) {
		return s
	}
	if n < 0 {
		n = 0
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// suffix returns the longest suffix of s of at most n bytes that starts
// at a rune boundary.
func suffix(s string, n int) string {
	if n >= len(s) {
		return s
	}
	i := len(s) - max(n, 0)
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return s[i:]
}
