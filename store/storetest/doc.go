// Package storetest starts real nats-servers with JetStream for
// the tests of any package: a random loopback port, storage in
// t.TempDir(), everything closed by t.Cleanup. [StartCluster] starts an
// in-process cluster whose servers stop gracefully; [StartProcCluster]
// starts nats-server processes (built once from this module's version
// into os.TempDir()/meshfold-storetest and reused) that a test kills with
// SIGKILL by pid, so that their peers see a crash and hold an election;
// [StartProcServer] starts one standalone nats-server process, the
// separate server of the outside benchmarks, whose CPU time [ProcCPU]
// reads from /proc. Every process these start dies with the test process
// (internal/testproc): a test binary killed from outside (a CI timeout)
// leaves none behind.
// It is a library for tests, not a test itself.
package storetest
