package main

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/store/storetest"
)

// TestReconcilePprof: --pprof serves the heap profile on the metrics
// listener, /metrics carries go_gc_heap_live_bytes, and --pprof without
// --metrics is a usage error.
func TestReconcilePprof(t *testing.T) {
	t.Parallel()
	srv := storetest.StartProcServer(t)
	key := filepath.Join(t.TempDir(), "signing.nk")
	var out, errb storetest.SyncBuffer
	if code := run(testCtx(t), []string{"reconcile", "--server", srv.URL(), "--signing-key", key, "--pprof"}, nil, &out, &errb); code != exitUsage {
		t.Fatalf("--pprof without --metrics: exit %d, want %d; %s", code, exitUsage, errb.String())
	}
	addr := storetest.FreeAddr(t)
	p := startReconcile(t, "--server", srv.URL(), "--signing-key", key, "--metrics", addr, "--pprof")
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := get("/metrics")
		if code == http.StatusOK && strings.Contains(body, "\ngo_gc_heap_live_bytes ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no go_gc_heap_live_bytes on /metrics within 30 s (%d); stderr: %s", code, p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, body := get("/debug/pprof/heap?gc=1&debug=1"); code != http.StatusOK || !strings.Contains(body, "heap profile:") {
		t.Fatalf("/debug/pprof/heap: %d %.200s", code, body)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d; stderr: %s", code, p.stderr.String())
	}
}
