package events

import (
	"errors"
	"strconv"
	"unicode"
)

// MaxExit bounds a have module's exit: a status or signal is a few bytes;
// a start failure is one error message, clipped by the node (DESIGN.md
// §10: every valid event must fit in a message).
const MaxExit = 256

// ErrBadExit: a have module's exit is too long or holds a control
// character.
var ErrBadExit = errors.New("must be at most 256 bytes without control characters")

// checkRuntimeFields checks the additive runtime fields of a have's
// module (DESIGN.md §8, §11): restarts and fill restarts not negative, exit short and
// printable, since not the zero time, health one of its three values.
func checkRuntimeFields(m HaveModule) error {
	if m.Restarts < 0 {
		return fieldErr("restarts", strconv.Itoa(m.Restarts), ErrBadValue)
	}
	if m.FillRestarts < 0 {
		return fieldErr("fill_restarts", strconv.Itoa(m.FillRestarts), ErrBadValue)
	}
	if len(m.Exit) > MaxExit || exitHasControl(m.Exit) {
		return fieldErr("exit", exitClip(m.Exit), ErrBadExit)
	}
	if m.Since != nil && m.Since.IsZero() {
		return fieldErr("since", "", ErrMissing)
	}
	switch m.Health {
	case "", HealthStarting, Healthy, Unhealthy:
	default:
		return fieldErr("health", exitClip(string(m.Health)), ErrBadValue)
	}
	return nil
}

func exitHasControl(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) {
			return true
		}
	}
	return false
}

// exitClip shortens v for an error message.
func exitClip(v string) string {
	if len(v) > 64 {
		return v[:64] + "…"
	}
	return v
}
