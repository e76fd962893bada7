// Package embedded runs meshfold's nats-server with JetStream inside the
// process, as `meshfold serve`, the demo and the tests do: a file store
// under a locked data directory, operator-mode authentication from
// [store.ServerAuth], TLS, the server's log through slog, and in-process
// connections.
//
// It is apart from package store so that the roles that only connect to
// a server (the node agent, the provisioner) link none of the server's
// packages (store.TestClientDeps checks it).
//
// Errors: [ErrDataDirInUse] when another server holds the data directory.
package embedded
