package runspec

import "time"

// Limits are a module's resource limits (DESIGN.md §8), applied to its
// cgroup; zero fields set no limit.
type Limits struct {
	// Memory is the most memory the module's processes may use, in bytes;
	// over it, the kernel's OOM killer kills one of them.
	Memory int64 `json:"memory,omitempty"`
	// CPU is how many cores' worth of time the module may use (fractional:
	// 0.5 is half a core), as a CFS quota per 100 ms.
	CPU float64 `json:"cpu,omitempty"`
	// Pids is the most processes and threads the module may have at once.
	Pids int64 `json:"pids,omitempty"`
}

// Bounds of Limits: a module needs some memory and a process to run at
// all; the upper bounds only refuse nonsense (an exabyte, a million cores).
const (
	MinMemoryLimit = 1 << 20 // bytes
	MaxCPULimit    = 4096    // cores
	MinPidsLimit   = 2       // the module's process and the shim's moment of starting it
)

// Health is a module's check (DESIGN.md §11 "Health"): exactly one of
// Exec, HTTP, TCP and Notify.
type Health struct {
	// Exec is an argv run as the module's user (a relative Exec[0] is in
	// the bundle): exit status 0 is a pass.
	Exec []string `json:"exec,omitempty"`
	// HTTP is a URL (http or https) that passes with a 2xx answer to GET.
	HTTP string `json:"http,omitempty"`
	// TCP is a host:port that passes when it accepts a connection.
	TCP string `json:"tcp,omitempty"`
	// Notify: the module speaks the systemd notify protocol on
	// NOTIFY_SOCKET (READY=1 passes; with an interval, WATCHDOG=1 must
	// come within each interval; STOPPING=1 ends the checking).
	Notify bool `json:"notify,omitempty"`
	// Interval is how often a check runs (a Go duration; default
	// DefaultHealthInterval); for notify, the watchdog's interval (no
	// watchdog when unset).
	Interval string `json:"interval,omitempty"`
	// Timeout is how long one try may take (default DefaultHealthTimeout).
	Timeout string `json:"timeout,omitempty"`
	// Grace is how long after a start failures do not count (default 0).
	Grace string `json:"grace,omitempty"`
	// Failures is how many consecutive failures make the module unhealthy
	// (default DefaultHealthFailures).
	Failures int `json:"failures,omitempty"`
	// Restart restarts an unhealthy module, through the crash backoff.
	Restart bool `json:"restart,omitempty"`
}

// Defaults and bounds of Health (the kubelet's probe defaults: every
// 10 s, 1 s per try, 3 failures).
const (
	DefaultHealthInterval = 10 * time.Second
	DefaultHealthTimeout  = time.Second
	DefaultHealthFailures = 3
	MinHealthInterval     = 100 * time.Millisecond
	MaxHealthDuration     = time.Hour
	MaxHealthFailures     = 1000
)

// Kind names the check: "exec", "http", "tcp" or "notify".
func (h Health) Kind() string {
	switch {
	case len(h.Exec) > 0:
		return "exec"
	case h.HTTP != "":
		return "http"
	case h.TCP != "":
		return "tcp"
	case h.Notify:
		return "notify"
	}
	return ""
}

// Durations returns the interval, timeout and grace with their defaults
// (a notify check without interval has no watchdog: interval 0).
func (h Health) Durations() (interval, timeout, grace time.Duration) {
	interval, _ = time.ParseDuration(h.Interval)
	if interval <= 0 && !h.Notify {
		interval = DefaultHealthInterval
	}
	timeout, _ = time.ParseDuration(h.Timeout)
	if timeout <= 0 {
		timeout = DefaultHealthTimeout
	}
	grace, _ = time.ParseDuration(h.Grace)
	return interval, timeout, max(grace, 0)
}

// FailuresOrDefault is Failures, or DefaultHealthFailures when unset.
func (h Health) FailuresOrDefault() int {
	if h.Failures <= 0 {
		return DefaultHealthFailures
	}
	return h.Failures
}
