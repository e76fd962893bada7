// Package store is meshfold's JetStream client, what every role uses:
// connections to a deployment, the event stream, publishing with message
// ids and expectations, reading events decoded as [Msg] (one newest
// event, a node's history, the one follow of a subject, [Tail], and
// [FollowNode], the follow-and-verify loop of the node agent and the
// provisioner), the snapshot bucket, and the signing and verifying of
// effects.
// The reconciler's loop that uses it is package engine.
//
// # Layout
//
// One stream (default MESH) captures the plain subjects of every event kind,
// <prefix>.<node>.<kind>, and stores each message under a partition token,
// <p>.<prefix>.<node>.<kind>, with p = FNV-1a-32(node) mod N (DESIGN.md §3).
// The partition count N is fixed for the stream's life; [EnsureStream]
// refuses to change it and never deletes or recreates a stream. The fill
// subject is never captured.
//
// Snapshots live in a KV bucket beside the stream (default MESH_SNAPSHOTS):
// node.<p>.<node> holds a node's folded state and checkpoint.<p> the stream
// sequence a partition's states cover. See docs/store.md.
//
// Sealed secrets (DESIGN.md §12) live in MESH_SECRETS, one key per
// (node, module, path) ([SecretKey]) holding a [SealedSecret]: ciphertext
// sealed to the node provisioner's curve key ([SealSecret],
// [SealedSecret.Open]), never content. Why a provisioner could not fill a
// file lives in MESH_FILLS under the same key ([FillStatus]).
//
// # Security
//
// The embedded server (package store/embedded, apart so that a role that
// only connects links no server) runs in NATS operator mode when given a
// [ServerAuth] (JWTs from package store/auth) and takes TLS clients when
// given a certificate; [ConnectConfig] connects with creds, NKeys, TLS
// and the user's own inbox prefix ([CredsInboxPrefix]). See
// docs/operations.md.
//
// # Errors
//
// Sentinels: [ErrConflict] (a publish's expected last subject sequence was
// stale; test with errors.Is, after [ServerError] for a future's raw
// error), [ErrIncompatibleStream] (an
// existing stream differs in something that cannot be changed),
// [ErrNoSnapshot] and [ErrNoMessage] (nothing stored under that name),
// [ErrNoSnapshots] (no snapshot bucket yet), [ErrConnClosed] (a
// connection closed for good: see [WhileConnected]), [ErrSealedToOther]
// and [ErrCannotOpen] (a sealed secret that does not open with a key),
// [ErrNoCurveKey].
// Validation failures of a payload or node name match events.ErrInvalid.
package store
