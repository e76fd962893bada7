package engine_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/store"
)

// deployFiles are the Grafana dashboard and the Prometheus rules shipped
// in deploy/.
var deployFiles = []string{"../deploy/grafana/meshfold.json", "../deploy/prometheus/meshfold-alerts.yml"}

var metricName = regexp.MustCompile(`\bmeshfold_[a-z0-9_]+`)

// Every metric the dashboard and the alert rules name is exported by a
// running reconciler, and the state gauges count what the states hold:
// a dashboard or a rule naming a metric nobody exports shows nothing and
// never fires.
func TestDeployMetricsExported(t *testing.T) {
	t.Parallel()
	named := map[string][]string{}
	for _, f := range deployFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range metricName.FindAllString(string(b), -1) {
			if !slices.Contains(named[n], filepath.Base(f)) {
				named[n] = append(named[n], filepath.Base(f))
			}
		}
	}
	if len(named) < 10 {
		t.Fatalf("the deploy files name %d metrics: %v", len(named), named)
	}

	started := time.Now()
	g := newRig(t, store.StreamConfig{})
	reg := prometheus.NewRegistry()
	m := engine.NewMetrics(reg)
	ctx, cancel := context.WithCancel(context.Background())
	r, err := engine.NewReconciler(ctx, g.js, engine.ReconcilerConfig{Stream: g.cfg, Metrics: m, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(r.StateCollector())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	// ace: a refused write, owed; shanks: incident 1 to its knock, then a
	// have with mesh-build-go failed; one event that cannot be decoded.
	p1 := g.planFor("ace", g.append("ace", provOnly()))
	g.append("ace", &events.Settle{Module: "provisioner", Op: events.OpApply, Plan: p1})
	g.append("ace", &events.Refusal{Module: "mesh-build-go", Path: creds, Reason: events.ReasonUndeclared, Plan: p1, Writer: "prov"})
	g.planFor("ace", g.append("ace", provAndBroker())) // unsettled
	g.incident1("shanks")
	g.append("shanks", &events.Have{Modules: []events.HaveModule{
		{Name: "mesh-build-go", Build: "g:1", State: events.Failed, Account: "mbg", Restarts: 4, Exit: "status 1"},
		{Name: "provisioner", Build: "p:1", State: events.Running, Account: "prov", Health: events.Unhealthy}}})
	g.append("shanks", &events.Agent{State: events.AgentDown, Claim: "c1", Why: events.WhyExpired})
	// Its provisioner down too, while its plan declares a file.
	g.append("shanks", &events.Prov{Agent: events.Agent{State: events.AgentDown, Claim: "p1", Why: events.WhyExpired}})
	if _, err := g.js.Publish(ctx, "mesh.ace.have", []byte(`{"v":1,"at":`)); err != nil {
		t.Fatal(err)
	}

	gauge := func(fams map[string]float64, name string) float64 { return fams[name] }
	var got map[string]float64
	eventually(t, "the state gauges", func() bool {
		got = gather(t, reg)
		return gauge(got, "meshfold_owed_items") == 1 && gauge(got, "meshfold_modules_failed") == 1 &&
			gauge(got, "meshfold_events_rejected_total") == 1 && gauge(got, "meshfold_plans_unsettled") == 1 &&
			gauge(got, "meshfold_nodes_agent_down") == 1 && gauge(got, "meshfold_modules_unhealthy") == 1 &&
			gauge(got, "meshfold_nodes_provisioner_down") == 1
	})
	// The refusal's stream time: after the rig started, before now.
	if ts := got["meshfold_owed_oldest_timestamp_seconds"]; ts < float64(started.Unix()) || ts > float64(time.Now().Unix()+1) {
		t.Errorf("meshfold_owed_oldest_timestamp_seconds = %v, want the refusal's stream time, between %v and now", ts, started.Unix())
	}
	for name, want := range map[string]float64{"meshfold_partitions": float64(g.cfg.Partitions), "meshfold_nodes": 2,
		"meshfold_nodes_owing": 1, "meshfold_partitions_owned": float64(g.cfg.Partitions)} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
	// A labelled counter's family is exported from its first sample on:
	// meshfold_effects_published_total, say, once a checkpoint has
	// collected the first publish's acknowledgement, which can come after
	// the gauges above. So wait, naming what is still missing.
	missing := func() (string, bool) {
		got := gather(t, reg)
		var missing []string
		for n, files := range named {
			base := n
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if s, ok := strings.CutSuffix(n, suf); ok {
					if _, hist := got[s]; hist {
						base = s
					}
				}
			}
			if _, ok := got[base]; !ok {
				missing = append(missing, n+" ("+strings.Join(files, ", ")+")")
			}
		}
		slices.Sort(missing)
		return "named by the deploy files, exported by no running reconciler: " + strings.Join(missing, "; "), len(missing) == 0
	}
	waitfor.Value(t, 20*time.Second, "every metric the deploy files name exported", missing)
}

// gather returns each metric family's name with the sum of its samples
// (a histogram's count).
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		var v float64
		for _, m := range f.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				v += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				v += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				v += float64(m.GetHistogram().GetSampleCount())
			}
		}
		out[f.GetName()] = v
	}
	return out
}
