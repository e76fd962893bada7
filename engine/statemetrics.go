package engine

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshfold/meshfold/events"
)

// The gauges of [Reconciler.StateCollector], read from the node states
// at each scrape.
var (
	descPartitions = prometheus.NewDesc("meshfold_partitions",
		"Partitions of the stream (fixed for its life); minus the sum of meshfold_partitions_owned over a group's instances, the partitions nobody folds.", nil, nil)
	descNodes = prometheus.NewDesc("meshfold_nodes",
		"Nodes whose states this instance holds.", nil, nil)
	descOwed = prometheus.NewDesc("meshfold_owed_items",
		"Unpaid owed items (refused filled-file writes not yet knocked, filled or waived) of the nodes this instance folds.", nil, nil)
	descOwing = prometheus.NewDesc("meshfold_nodes_owing",
		"Nodes this instance folds with at least one unpaid owed item.", nil, nil)
	descFailed = prometheus.NewDesc("meshfold_modules_failed",
		"Modules the newest have of their node reports failed: exited or could not start, waiting to restart (a crash loop while it lasts).", nil, nil)
	descUnsettled = prometheus.NewDesc("meshfold_plans_unsettled",
		"Plans emitted and not settled yet, over the nodes this instance folds.", nil, nil)
	descOldestOwed = prometheus.NewDesc("meshfold_owed_oldest_timestamp_seconds",
		"Stream time (Unix seconds) of the refusal of the oldest unpaid owed item; absent when nothing is owed. time() minus it is the age of the oldest owed item.", nil, nil)
	descPaused = prometheus.NewDesc("meshfold_nodes_paused",
		"Nodes paused by an operator (DESIGN.md §9): no new plan is emitted for them.", nil, nil)
	descAgentDown = prometheus.NewDesc("meshfold_nodes_agent_down",
		"Nodes this instance folds whose agent is down (DESIGN.md §11): its lease ended (expired, released or replaced) and no have came since.", nil, nil)
	descProvisionerDown = prometheus.NewDesc("meshfold_nodes_provisioner_down",
		"Nodes this instance folds whose provisioner client is down (its lease ended) while their plan declares a file: nobody answers their knocks (reconcile.View.ProvisionerDown).", nil, nil)
	descUnhealthy = prometheus.NewDesc("meshfold_modules_unhealthy",
		"Modules the newest have of their node reports unhealthy: alive, their health check failing (DESIGN.md §11).", nil, nil)
)

// stateCollector counts over every node state of a Reconciler.
type stateCollector struct{ r *Reconciler }

// StateCollector returns a Prometheus collector of gauges read from this
// instance's node states at each scrape (meshfold_partitions,
// meshfold_nodes, meshfold_owed_items, meshfold_nodes_owing,
// meshfold_owed_oldest_timestamp_seconds, meshfold_modules_failed,
// meshfold_plans_unsettled, meshfold_nodes_paused,
// meshfold_nodes_agent_down, meshfold_nodes_provisioner_down,
// meshfold_modules_unhealthy). A scrape takes each
// partition's lock once, for a count over its states: register it with the
// registry that serves /metrics (meshfold serve and reconcile do).
func (r *Reconciler) StateCollector() prometheus.Collector { return stateCollector{r} }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPartitions, descNodes, descOwed, descOwing, descFailed, descUnsettled, descOldestOwed, descPaused,
		descAgentDown, descProvisionerDown, descUnhealthy} {
		ch <- d
	}
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.r
	parts := r.partitionsHeld()
	var nodes, owed, owing, failed, unsettled, paused, agentDown, provDown, unhealthy int
	var oldest time.Time
	for _, p := range parts {
		p.mu.Lock()
		for _, st := range p.states {
			nodes++
			owed += len(st.Owed)
			if len(st.Owed) > 0 {
				owing++
			}
			unsettled += len(st.Unsettled)
			for _, it := range st.Owed {
				if !it.Time.IsZero() && (oldest.IsZero() || it.Time.Before(oldest)) {
					oldest = it.Time
				}
			}
			if st.Paused != nil {
				paused++
			}
			if st.Agent != nil && !st.Agent.Up {
				agentDown++
			}
			if st.Provisioner != nil && st.ProvisionerDown() != nil {
				provDown++
			}
			if st.Have != nil {
				// What reconcile.RuntimeOf's rows say of each module
				// (Failing, Health), read without making them: a scrape
				// made a row a module of every node, 130 MB of garbage
				// at 100,000 nodes (issue 27).
				for _, m := range st.Have.Modules {
					if m.State == events.Failed {
						failed++
					}
					if m.Health == events.Unhealthy {
						unhealthy++
					}
				}
			}
		}
		p.mu.Unlock()
	}
	g := func(d *prometheus.Desc, v int) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	g(descPartitions, r.cfg.Stream.Partitions)
	g(descNodes, nodes)
	g(descOwed, owed)
	g(descOwing, owing)
	g(descFailed, failed)
	g(descUnsettled, unsettled)
	g(descPaused, paused)
	g(descAgentDown, agentDown)
	g(descProvisionerDown, provDown)
	g(descUnhealthy, unhealthy)
	if !oldest.IsZero() {
		ch <- prometheus.MustNewConstMetric(descOldestOwed, prometheus.GaugeValue, float64(oldest.UnixNano())/1e9)
	}
}
