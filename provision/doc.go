// Package provision is meshfold's provisioner client as a library: it
// fills one node's declared files from its sources (a directory, an exec
// helper, sealed secrets; DESIGN.md §12) through the node agent's fill
// endpoint, on start and again on every knock the reconciler publishes
// for that node (DESIGN.md §1, §3, incident 1).
//
// # What it fills
//
// Each fill reads the node's newest plan (a direct get) and sends every
// file of every row, composed or held (a held row's files stay declared),
// in the plan's order. The content comes from the client's sources
// ([Source]), tried in order, the first with content winning (DESIGN.md
// §12): a directory ([Dir]: module M's file /P is read from DIR/M/P, e.g.
// /srv/secrets/mesh-build-go/run/mesh-build-go/broker.creds for the file
// /run/mesh-build-go/broker.creds of module mesh-build-go), a helper
// command ([Exec], as git's credential helpers), or the node's sealed
// secrets ([Sealed], opened with the provisioner's curve key). A file no
// source gives is logged and skipped, not an error; why (no source, a
// failed helper, a secret sealed to another key or that cannot be opened)
// is kept in the fill status bucket ([Config.Status]) until it is filled.
// A sealed secret that is stored but removed (`secret rm`), sealed to
// another key or that cannot be opened stops the sources after it: the
// file keeps what it holds, since what a later source holds is older
// than what an operator put.
// A sealed secret put or removed is filled at once: the client watches
// the node's keys.
//
// # Requests, retries and refusals
//
// A fill is a NATS request on mesh.<node>.fill with the headers
// Meshfold-Module, Meshfold-Path and Meshfold-Writer (the client's
// Account; events.FillRequest) and the content as its body; the node
// replies events.FillReply (events.DecodeFillReply). Transport failures (no responders, a timeout, a node
// agent that is stopping) are retried with exponential, jittered backoff
// capped at 10 s, for as long as the context allows. A refusal is not
// retried: the node reports it, the reconciler owes it, and the knock that
// follows once a settled plan accepts it brings the next try. A request
// the node rejects as malformed is reported and not retried.
//
// # Knocks
//
// [Client.Run] notes the stream position of the node's newest knock,
// fills everything, then follows the knocks after that position with
// [store.FollowNode] (an ordered consumer, no durable consumer; the loop
// the node agent follows its plans with) and fills everything again on
// each. A knock missed while the client was down is covered by the fill
// on start. With [Config.Trust], a knock whose signature does not verify
// is logged and ignored, and so is a newest plan (nothing is filled from
// it). One refused for its signer (a key the trust does not name, one
// retired past its overlap, or none) is also recorded in the fill status
// bucket, once per cause: a node-level status in state
// store.FillUntrusted under store.TrustStatusKey, naming the key, which
// `state`, `fleet`, `poke` and the console show in place of an unanswered
// knock; it is deleted once the newest plan and knock are trusted again.
// Knocks that arrive while a fill runs are
// coalesced: only the newest accepted knock of a backlog triggers a fill.
// The client records the newest knock it took in the fill status bucket
// (store.KnockAnswer, under store.KnockAnswerKey: on start, the newest
// knock then, which the fill on start covers; then each knock as it takes
// it, before its fill), so that a knock nobody answers shows: `meshfold
// poke` waits for it, `state` and `fleet` show a knock unanswered.
//
// # Resync
//
// Every [Config.Resync] (10 minutes by default) the client fills
// everything again, as on start: a source file that was missing, or a
// filled file deleted on the node, is filled within that interval.
//
// # New declarations
//
// Knocks pay refused writes only. A file that a new plan declares, and
// that nobody tried to write, would otherwise wait for a restart of the
// client. So the client also follows the node's settles: when the node
// settles its newest plan, the client fills that plan's files that the
// last plan it filled did not declare (all of them when the provisioner
// account changed). The node judges that write by the plan that declares
// it, so the normal path makes no refusal and no knock. At that settle it
// also sends again every file the plan declares whose last write it sent
// was refused: a knock is not guaranteed for such a file (a repeated
// refusal of an item already paid is dropped as a duplicate, and then
// nothing is owed). (DESIGN.md is silent here; docs/architecture.md
// records the decision.)
//
// Content is never logged, returned in an error or put in a [Report].
package provision
