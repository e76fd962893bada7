package store

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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

// Reasked counts the reconnects of an EndOnLoss tail's connection whose
// asks of the consumer are done.
func (t *Tail) Reasked() int { return int(t.reasked.Load()) }

// PubAckReadAsJSON fails t when the reflection-free reading of a
// publish's answer takes data and reads it other than encoding/json; it
// reports whether it took data.
func PubAckReadAsJSON(t testing.TB, data []byte) bool { return checkPubAck(t, data) }

// DecodeAnswer reads a publish's answer as an asynchronous publish's
// future gets it: its ack, or its error.
func DecodeAnswer(data []byte) (*jetstream.PubAck, error) { return (&acks{}).decode(data) }
