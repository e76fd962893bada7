// Package storetest starts a real embedded nats-server with JetStream for
// the tests of any package: a random loopback port, storage in
// t.TempDir(), everything closed by t.Cleanup. It is a library for tests,
// not a test itself.
package storetest
