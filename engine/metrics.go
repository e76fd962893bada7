package engine

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the reconciler's Prometheus metrics. Register them once
// with [NewMetrics]; a nil *Metrics records nothing.
type Metrics struct {
	// Folded counts events folded, by kind.
	Folded *prometheus.CounterVec
	// Rejected counts events journaled as not folded (undecodable,
	// invalid, a newer schema, a plan that does not exist yet).
	Rejected prometheus.Counter
	// BadSubject counts messages whose subject names no valid node.
	BadSubject prometheus.Counter
	// Effects counts effects published, by kind (plan, knock, journal).
	Effects *prometheus.CounterVec
	// Skipped counts effects found already published after a restart.
	Skipped prometheus.Counter
	// Poison counts effects that could never be stored (over the
	// server's max_payload, invalid): journaled, shortened, and skipped.
	Poison prometheus.Counter
	// TooBig counts node-state snapshots written as a refold marker
	// because the state was over the server's max_payload.
	TooBig prometheus.Counter
	// Lag is, per partition, the partition's messages not yet folded.
	Lag *prometheus.GaugeVec
	// Folding is the time to decode and fold one event, in seconds, for
	// one message in 16 (the clock reads cost more than sampling loses).
	Folding prometheus.Histogram
	// Publishing is the time from publishing an effect to its ack, in
	// seconds.
	Publishing prometheus.Histogram
	// Checkpoints counts snapshots written.
	Checkpoints prometheus.Counter
	// Restarts counts partition sessions restarted after an error.
	Restarts prometheus.Counter
	// Owned is the number of partitions this instance folds now.
	Owned prometheus.Gauge
	// HeapReleases counts the times the heap freed by partitions'
	// loads was returned to the operating system (see heapRelease).
	HeapReleases prometheus.Counter
	// Agents counts the node agents' transitions this instance recorded
	// (DESIGN.md §11 "Liveness"), by state: up, down.
	Agents *prometheus.CounterVec
	// ReadsMoved counts the times a partition's read moved to a new
	// consumer, its state kept, by why: lost (the client ended the
	// consumption: two missed heartbeats, the consumer deleted, a
	// delivery skipped), stalled (the consumer held input it did not
	// deliver) or elected (a new stream leader, and the consumer then
	// gone or unanswered: readGone). Each lost or stalled read waited:
	// up to two heartbeats (2 s), or readStallAfter (10 s; 2 s after an
	// election found it holding input).
	ReadsMoved *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them with reg (nil: not
// registered anywhere, still counted).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Folded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshfold_events_folded_total",
			Help: "Events folded into node states, by kind."}, []string{"kind"}),
		Rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshfold_events_rejected_total",
			Help: "Events journaled as not folded: undecodable, invalid, newer schema, or naming a plan that does not exist yet."}),
		BadSubject: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshfold_events_bad_subject_total",
			Help: "Messages whose subject names no valid node; logged and skipped."}),
		Effects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshfold_effects_published_total",
			Help: "Effects published, by kind (plan, knock, journal)."}, []string{"kind"}),
		Skipped: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshfold_effects_skipped_total",
			Help: "Effects found already published when refolding after a restart."}),
		Poison: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshfold_effects_poison_total",
			Help: "Effects that could never be stored (over max_payload, invalid): journaled and skipped."}),
		TooBig: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshfold_snapshots_too_big_total",
			Help: "Node-state snapshots over max_payload, written as a marker that makes a restart refold the node."}),
		Lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meshfold_partition_lag_messages",
			Help: "Messages of the partition stored but not yet folded."}, []string{"partition"}),
		Folding: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "meshfold_fold_seconds",
			Help: "Time to decode and fold one event (one message in 16 is timed).", Buckets: prometheus.ExponentialBuckets(250e-9, 2, 14)}),
		Publishing: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "meshfold_publish_seconds",
			Help: "Time from publishing an effect to the stream's acknowledgement.", Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16)}),
		Checkpoints: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshfold_checkpoints_total",
			Help: "Snapshots of a partition written."}),
		Restarts: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshfold_partition_restarts_total",
			Help: "Partition sessions restarted from their snapshot after an error."}),
		Owned: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meshfold_partitions_owned",
			Help: "Partitions this reconciler instance folds now (all of them unless it runs in a group)."}),
		HeapReleases: prometheus.NewCounter(prometheus.CounterOpts{Name: "meshfold_heap_releases_total",
			Help: "Times the heap freed by loading partitions (their snapshots and the refold of their tail) was returned to the operating system, once no partition was still loading."}),
		Agents: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshfold_agent_transitions_total",
			Help: "Node agents seen going down (lease expired, released or replaced) or coming back (lease claimed), recorded in the stream by this instance; another instance of a group may have recorded the rest."}, []string{"state"}),
		ReadsMoved: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshfold_partition_reads_moved_total",
			Help: "Times a partition's read moved to a new consumer, its state kept, by reason: lost (two missed heartbeats, the consumer deleted, a delivery skipped), stalled (the consumer held input it did not deliver), elected (a new stream leader, and the consumer then gone or unanswered)."}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.Folded, m.Rejected, m.BadSubject, m.Effects, m.Skipped, m.Poison, m.TooBig, m.Lag,
			m.Folding, m.Publishing, m.Checkpoints, m.Restarts, m.Owned, m.HeapReleases, m.Agents, m.ReadsMoved)
	}
	return m
}
