package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/meshfold/meshfold/console"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
)

// BenchmarkConsoleNode10k compares, for one node with 10,000 events in
// the stream, `meshfold audit NODE` (the whole command: connect, read and
// decode the node's events, print the timeline) with the console's node
// page (read, decode, timeline of the default window of 300 events and
// its picture, the state folded from the history: no reconciler runs),
// and the page of the whole range (?from=1&to=…: the picture of its
// newest 2,000 events). It reports the milliseconds of each and the page
// sizes; ns/op is the sum.
func BenchmarkConsoleNode10k(b *testing.B) {
	if testing.Short() {
		b.Skip("-short")
	}
	const n = 10000
	s := reconciletest.Scripted([]string{"ace"}, n, 7, nil)
	s.Events = s.Events[:n]
	m := startMesh(b)
	m.publish(b, s)
	ctx := context.Background()
	r, err := query.New(m.nc, query.Config{Stream: m.cfg, Timeout: 200 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	c, err := console.New(console.Config{Source: r})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(c)
	defer srv.Close()
	get := func(path string) int {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			b.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
		}
		return len(body)
	}
	audit := func() int {
		code, out, errs := runCLI(ctx, "audit", "ace", "--server", m.e.ClientURL())
		if code != exitOK {
			b.Fatalf("audit: %d %s", code, errs)
		}
		return len(out)
	}
	all := "/node/ace?from=1&to=" + seqArg(s.Events[n-1].Seq)
	audit()
	get("/node/ace")
	var auditT, pageT, allT time.Duration
	var auditB, pageB, allB, runs int
	for b.Loop() {
		t0 := time.Now()
		auditB = audit()
		t1 := time.Now()
		pageB = get("/node/ace")
		t2 := time.Now()
		allB = get(all)
		auditT += t1.Sub(t0)
		pageT += t2.Sub(t1)
		allT += time.Since(t2)
		runs++
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(runs) / 1000 }
	b.ReportMetric(ms(auditT), "audit-ms")
	b.ReportMetric(ms(pageT), "page-ms")
	b.ReportMetric(ms(allT), "page-all-ms")
	b.ReportMetric(float64(auditB), "audit-B")
	b.ReportMetric(float64(pageB), "page-B")
	b.ReportMetric(float64(allB), "page-all-B")
}
