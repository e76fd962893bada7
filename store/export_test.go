package store

import (
	"time"

	"github.com/nats-io/nats.go"
)

// ProvablyDead exports provablyDead to the tests of package store_test.
var ProvablyDead = provablyDead

// DenialsWatched reports whether denialsOf holds nc's denials.
func DenialsWatched(nc *nats.Conn) bool {
	_, ok := denialsOf.Load(nc)
	return ok
}

// DenialsHeld counts the connections denialsOf holds.
func DenialsHeld() int {
	n := 0
	denialsOf.Range(func(any, any) bool { n++; return true })
	return n
}

// WithLossAsk returns cfg whose tail bounds its ask of the consumer after
// missed heartbeats by d rather than lossAsk.
func WithLossAsk(cfg TailConfig, d time.Duration) TailConfig {
	cfg.lossAsk = d
	return cfg
}

// HeartbeatsMissed counts the client's reports of missed heartbeats to an
// EndOnLoss tail.
func (t *Tail) HeartbeatsMissed() int { return int(t.missed.Load()) }
