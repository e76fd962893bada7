package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
)

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
