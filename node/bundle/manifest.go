package bundle

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"
)

// ManifestName is the manifest's file name at the root of a bundle.
const ManifestName = "meshfold.json"

// Defaults of DESIGN.md §8: a module is stopped with SIGTERM, then SIGKILL
// after 10 s.
const (
	DefaultStopSignal  = "SIGTERM"
	DefaultStopTimeout = 10 * time.Second
	// MaxStopTimeout bounds stop_timeout: a removal or a new build waits
	// this long at most before the process group is killed.
	MaxStopTimeout = 10 * time.Minute
)

// Errors of manifest validation, wrapped in a *ManifestError naming the
// field.
var (
	// ErrInvalidManifest matches every manifest validation failure.
	ErrInvalidManifest = errors.New("bundle: invalid manifest")
)

// ManifestError names the manifest field that failed and why.
type ManifestError struct {
	Field  string // JSON path, e.g. "command[0]" or "env.PATH"
	Reason string
}

func (e *ManifestError) Error() string {
	return fmt.Sprintf("bundle: manifest %s: %s", e.Field, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalidManifest) hold.
func (e *ManifestError) Unwrap() error { return ErrInvalidManifest }

// OnFill actions (DESIGN.md §8): what a running module gets when one of its
// filled files is written. "signal:<NAME>" sends that signal.
const (
	OnFillNone    = "none"
	OnFillRestart = "restart"
	onFillSignal  = "signal:"
)

// Manifest is meshfold.json: how a bundle runs.
type Manifest struct {
	// Command is the argv, required. A relative Command[0] (one without a
	// slash at its start) names a file inside the bundle.
	Command []string `json:"command"`
	// Env is added to the process environment. Never secrets: those are
	// filled files.
	Env map[string]string `json:"env,omitempty"`
	// StopSignal is the signal that asks the module to stop ("SIGTERM" when
	// empty); see [Manifest.Signal].
	StopSignal string `json:"stop_signal,omitempty"`
	// StopTimeout is how long a stop waits before SIGKILL, a Go duration
	// ("10s" when empty); see [Manifest.Timeout].
	StopTimeout string `json:"stop_timeout,omitempty"`
	// OnFill is "none" (or empty), "restart" or "signal:<NAME>".
	OnFill string `json:"on_fill,omitempty"`
}

// ParseManifest decodes and validates a manifest. Unknown fields are
// refused (a typo must not silently become a default).
//
// Errors: a *ManifestError matching ErrInvalidManifest.
func ParseManifest(data []byte) (Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, &ManifestError{Field: ManifestName, Reason: err.Error()}
	}
	if dec.More() {
		return Manifest{}, &ManifestError{Field: ManifestName, Reason: "trailing data after the JSON object"}
	}
	if err := m.Validate(); err != nil {
		return Manifest{}, err
	}
	return m, nil
}

// Validate checks every field.
//
// Errors: a *ManifestError matching ErrInvalidManifest.
func (m Manifest) Validate() error {
	if len(m.Command) == 0 || m.Command[0] == "" {
		return &ManifestError{Field: "command", Reason: "required: the argv to run"}
	}
	for i, a := range m.Command {
		if strings.ContainsRune(a, 0) {
			return &ManifestError{Field: fmt.Sprintf("command[%d]", i), Reason: "contains NUL"}
		}
	}
	if c := m.Command[0]; !strings.HasPrefix(c, "/") {
		for _, part := range strings.Split(c, "/") {
			if part == ".." {
				return &ManifestError{Field: "command[0]", Reason: "a relative command must stay inside the bundle (no ..)"}
			}
		}
	}
	for k, v := range m.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return &ManifestError{Field: "env", Reason: fmt.Sprintf("bad variable name %q", k)}
		}
		if strings.HasPrefix(k, "MESHFOLD_") {
			return &ManifestError{Field: "env." + k, Reason: "MESHFOLD_ variables are set by the node agent"}
		}
		if strings.ContainsRune(v, 0) {
			return &ManifestError{Field: "env." + k, Reason: "contains NUL"}
		}
	}
	if m.StopSignal != "" {
		if _, ok := SignalByName(m.StopSignal); !ok {
			return &ManifestError{Field: "stop_signal", Reason: fmt.Sprintf("unknown signal %q", m.StopSignal)}
		}
	}
	if m.StopTimeout != "" {
		d, err := time.ParseDuration(m.StopTimeout)
		if err != nil || d <= 0 || d > MaxStopTimeout {
			return &ManifestError{Field: "stop_timeout", Reason: fmt.Sprintf("%q: want a duration above 0 and at most %s", m.StopTimeout, MaxStopTimeout)}
		}
	}
	switch {
	case m.OnFill == "", m.OnFill == OnFillNone, m.OnFill == OnFillRestart:
	case strings.HasPrefix(m.OnFill, onFillSignal):
		if _, ok := SignalByName(strings.TrimPrefix(m.OnFill, onFillSignal)); !ok {
			return &ManifestError{Field: "on_fill", Reason: fmt.Sprintf("unknown signal in %q", m.OnFill)}
		}
	default:
		return &ManifestError{Field: "on_fill", Reason: fmt.Sprintf("%q: want none, restart or signal:<NAME>", m.OnFill)}
	}
	return nil
}

// Signal is the stop signal (SIGTERM when unset).
func (m Manifest) Signal() syscall.Signal {
	if s, ok := SignalByName(m.StopSignal); ok {
		return s
	}
	return syscall.SIGTERM
}

// Timeout is the stop timeout (10 s when unset).
func (m Manifest) Timeout() time.Duration {
	if d, err := time.ParseDuration(m.StopTimeout); err == nil && d > 0 {
		return d
	}
	return DefaultStopTimeout
}

// FillAction returns what a running module gets on a fill: restart, or a
// signal (sig != 0), or neither.
func (m Manifest) FillAction() (restart bool, sig syscall.Signal) {
	switch {
	case m.OnFill == OnFillRestart:
		return true, 0
	case strings.HasPrefix(m.OnFill, onFillSignal):
		s, _ := SignalByName(strings.TrimPrefix(m.OnFill, onFillSignal))
		return false, s
	}
	return false, 0
}

var signals = map[string]syscall.Signal{
	"SIGHUP": syscall.SIGHUP, "SIGINT": syscall.SIGINT, "SIGQUIT": syscall.SIGQUIT,
	"SIGKILL": syscall.SIGKILL, "SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2,
	"SIGTERM": syscall.SIGTERM, "SIGWINCH": syscall.SIGWINCH, "SIGALRM": syscall.SIGALRM,
	"SIGCONT": syscall.SIGCONT, "SIGSTOP": syscall.SIGSTOP, "SIGPWR": syscall.SIGPWR,
}

// SignalByName maps "SIGTERM" or "TERM" (any case) to its signal.
func SignalByName(name string) (syscall.Signal, bool) {
	n := strings.ToUpper(name)
	if !strings.HasPrefix(n, "SIG") {
		n = "SIG" + n
	}
	s, ok := signals[n]
	return s, ok
}
