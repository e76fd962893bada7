// Package runspec holds the part of a bundle's manifest that a module's
// supervisor enforces: its resource limits and its health check
// (DESIGN.md §8 and §11). It imports nothing but the standard library, so
// the shim (node/process/shim) reads them without linking the bundle
// store's NATS client; package bundle names them as aliases and
// validates them.
package runspec
