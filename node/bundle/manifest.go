package bundle

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/meshfold/meshfold/node/bundle/runspec"
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
	// Limits bounds the module's whole tree where the node can make it a
	// cgroup (DESIGN.md §8); optional.
	Limits *Limits `json:"limits,omitempty"`
	// Health is the module's one check (DESIGN.md §11 "Health");
	// optional.
	Health *Health `json:"health,omitempty"`
}

// Limits are a module's resource limits (DESIGN.md §8); see
// [runspec.Limits].
type Limits = runspec.Limits

// Health is a module's check (DESIGN.md §11 "Health"); see
// [runspec.Health].
type Health = runspec.Health

// Bounds of Limits, and defaults and bounds of Health (see runspec).
const (
	MinMemoryLimit        = runspec.MinMemoryLimit
	MaxCPULimit           = runspec.MaxCPULimit
	MinPidsLimit          = runspec.MinPidsLimit
	DefaultHealthInterval = runspec.DefaultHealthInterval
	DefaultHealthTimeout  = runspec.DefaultHealthTimeout
	DefaultHealthFailures = runspec.DefaultHealthFailures
	MinHealthInterval     = runspec.MinHealthInterval
	MaxHealthDuration     = runspec.MaxHealthDuration
	MaxHealthFailures     = runspec.MaxHealthFailures
)

func validateHealth(h Health) error {
	kinds := 0
	for _, set := range []bool{len(h.Exec) > 0, h.HTTP != "", h.TCP != "", h.Notify} {
		if set {
			kinds++
		}
	}
	if kinds != 1 {
		return &ManifestError{Field: "health", Reason: "want exactly one of exec, http, tcp and notify"}
	}
	for i, a := range h.Exec {
		if strings.ContainsRune(a, 0) || (i == 0 && a == "") {
			return &ManifestError{Field: fmt.Sprintf("health.exec[%d]", i), Reason: "empty or contains NUL"}
		}
	}
	if len(h.Exec) > 0 && !strings.HasPrefix(h.Exec[0], "/") && slices.Contains(strings.Split(h.Exec[0], "/"), "..") {
		return &ManifestError{Field: "health.exec[0]", Reason: "a relative command must stay inside the bundle (no ..)"}
	}
	if h.HTTP != "" {
		u, err := url.Parse(h.HTTP)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return &ManifestError{Field: "health.http", Reason: fmt.Sprintf("%q: want an http:// or https:// URL with a host", h.HTTP)}
		}
	}
	if h.TCP != "" {
		if host, port, err := net.SplitHostPort(h.TCP); err != nil || port == "" || strings.ContainsAny(host, "/ ") {
			return &ManifestError{Field: "health.tcp", Reason: fmt.Sprintf("%q: want host:port", h.TCP)}
		}
	}
	for _, d := range []struct {
		field, v string
		min      time.Duration
	}{{"interval", h.Interval, MinHealthInterval}, {"timeout", h.Timeout, time.Millisecond}, {"grace", h.Grace, 0}} {
		if d.v == "" {
			continue
		}
		v, err := time.ParseDuration(d.v)
		if err != nil || v < d.min || v > MaxHealthDuration || (d.min > 0 && v <= 0) {
			return &ManifestError{Field: "health." + d.field, Reason: fmt.Sprintf("%q: want a duration from %s to %s", d.v, d.min, MaxHealthDuration)}
		}
	}
	if h.Failures < 0 || h.Failures > MaxHealthFailures {
		return &ManifestError{Field: "health.failures", Reason: fmt.Sprintf("%d: want 1 to %d (0: the default, %d)", h.Failures, MaxHealthFailures, DefaultHealthFailures)}
	}
	return nil
}

func validateLimits(l Limits) error {
	switch {
	case l.Memory != 0 && l.Memory < MinMemoryLimit:
		return &ManifestError{Field: "limits.memory", Reason: fmt.Sprintf("%d: want bytes, at least %d", l.Memory, MinMemoryLimit)}
	case l.CPU < 0 || l.CPU > MaxCPULimit || math.IsNaN(l.CPU) || (l.CPU > 0 && l.CPU < 0.01):
		return &ManifestError{Field: "limits.cpu", Reason: fmt.Sprintf("%g: want cores from 0.01 to %d", l.CPU, MaxCPULimit)}
	case l.Pids != 0 && l.Pids < MinPidsLimit:
		return &ManifestError{Field: "limits.pids", Reason: fmt.Sprintf("%d: want at least %d", l.Pids, MinPidsLimit)}
	}
	return nil
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
	if m.Limits != nil {
		if err := validateLimits(*m.Limits); err != nil {
			return err
		}
	}
	if m.Health != nil {
		if err := validateHealth(*m.Health); err != nil {
			return err
		}
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
