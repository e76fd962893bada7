// Package shim supervises one module's process: it is the program the
// process runtime (node/process) starts per module, which outlives the
// agent (DESIGN.md §8). [Main] reads the module's spec.json, starts the
// module in its cgroup (or process group) as its account, restarts it
// with backoff, runs its health check, writes its output to module.log,
// stops its whole tree, and answers the runtime on shim.sock (JSON lines,
// [Request] and [Status]). The rest is what the runtime shares with it:
// the directory's files, the process identity checks, the socket helpers
// and the cleanup of a lost shim's leftovers ([KillCgroup], [KillByEnv]).
//
// The package links no NATS client and no bundle store: the dedicated
// meshfold-shim binary (cmd/meshfold-shim) is this package and little
// else, so that a node with 100 modules pays little memory for their
// supervisors (issue 27; docs/architecture.md, "Memory per shim").
package shim
