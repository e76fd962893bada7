// Command meshfold-shim supervises one module's process: the node agent's
// process runtime starts one per module, as `meshfold-shim DIR`, never by
// hand (package node/process/shim does the work). It is a binary of its
// own, installed beside meshfold, because it links only the shim's code:
// a node with 100 modules runs 100 of them (issue 27; docs/architecture.md,
// "Memory per shim").
//
// `meshfold-shim --version` prints its version, commit and protocol:
//
//	meshfold-shim v0.9.0 commit 1a2b3c4 protocol 1
//
// The agent runs it once at start and refuses a shim binary of another
// protocol.
package main
