package store

import "github.com/nats-io/nats.go"

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
