// Package auth issues and revokes meshfold's NATS credentials: an
// operator, a system account, a mesh account with JetStream, and one user
// per role with least-privilege permissions, in decentralized JWT auth
// (github.com/nats-io/jwt/v2, github.com/nats-io/nkeys), the standard way
// NATS deployments issue and revoke credentials without a server restart.
//
// An auth directory ([Init], [Open]) holds the operator's and the
// accounts' keys and every user's creds file; it is the mesh's root of
// trust and belongs on an administrator's machine, with mode 0700. Only
// each creds file travels to its role. [Permissions] is the whole policy,
// one function; docs/operations.md shows it as a table, and the
// permission matrix test checks it against a real server.
//
// Users: "reconciler", "controller", "operator", "operator-read" ([Init],
// [Dir.AddUser]); "operator-<name>" per person ([Dir.AddOperator]);
// "node-<N>" and
// "provisioner-<N>" per node ([Dir.AddNode]); "sys" in the system
// account, to push account updates ([Dir.Push]). Each user may read only
// its own inbox, _INBOX_<user>; store.Connect finds that prefix in the
// creds file (store.CredsInboxPrefix).
//
// The embedded server trusts a directory through [Dir.ServerAuth]
// (store/embedded's Config.Auth); an external nats-server or cluster
// through resolver.conf ([Dir.ResolverConfig]).
//
// # Errors
//
// Sentinels: [ErrExists], [ErrNotAuthDir], [ErrUserExists],
// [ErrUnknownUser], [ErrSystemUser], [ErrUnknownRole], [ErrReservedName], [ErrPushSkipped],
// [ErrNoAnswer]. A bad node name
// matches events.ErrInvalid.
package auth
