package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
)

// The tests of this package call t.Parallel: most of their time is spent
// waiting on servers, elections, leases and timers, not computing. A test
// stays serial, and says why on its first line ("Not parallel: ..."), when
// it sets the environment (t.Setenv) or a package-level hook, measures the
// process, or times something against a tight limit. The serial ones run
// first, alone; then the parallel ones, -parallel at a time. A
// reconciler's own bounds a test shortens go through its ReconcilerConfig
// (SetReadStallAfter and the others of export_*_test.go), never a
// package variable.

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func want(build string) *events.Want {
	return events.Stamp(&events.Want{Modules: []events.WantModule{{Name: "postgres", Build: build}}}, t0)
}

func journal(msg string) *events.Journal {
	return events.Stamp(&events.Journal{Level: events.LevelInfo, Msg: msg, Cause: 1}, t0)
}
