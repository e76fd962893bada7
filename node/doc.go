// Package node is meshfold's node agent as a library: it follows one
// node's plans, applies them through a [Runtime], publishes what runs
// (have) and when an apply settled (settle), and serves the node's fill
// requests, judging each write by the plan it has settled (DESIGN.md §4,
// "judge a write") and reporting it as filled or refused.
//
// # One agent per node
//
// [Agent.Run] first claims the node's lease, the key <node> of the KV
// bucket <stream>_NODES ([store.AcquireLease]): created only if absent,
// renewed every TTL/4 (5 s TTL by default), deleted on a clean stop. A
// second agent of the node is refused at start with a [*store.HeldError]
// naming the holder's host, pid and since; after an agent died without
// releasing it, the next one on the same host takes it at once (the dead
// pid is provably gone), one on another host waits for the key to expire
// (about the TTL).
// An agent whose lease another agent took meanwhile stops.
//
// # Following plans
//
// On start [Agent.Run] reads the node's newest plan with a direct get and
// then follows newer ones with [store.FollowNode] (an ordered consumer
// filtered to the node's stored plan subject: no durable consumer per
// node), the loop the provisioner follows its knocks with. Each plan is
// verified as it arrives (with [Config.Trust]: signed by a trusted key, a
// cause below its own sequence, a cause newer than the settled plan's);
// a refused plan is logged and reported with a failed settle naming it,
// and never applied. Of plans stored while the agent was busy or away,
// only the newest accepted one is applied. Plans are applied one at a
// time, in stream order:
//
//  1. Each composed row whose build or account differs from what the
//     runtime runs is applied ([Runtime.Apply]), in the plan's order. A
//     held row is kept as it runs: neither applied nor removed, also when
//     its build is empty (nothing runs). Then every module the runtime
//     runs that the plan has no row for is removed ([Runtime.Remove]), in
//     name order. A row whose files alone changed needs no runtime work.
//  2. Under the lock the fill handler judges under, the plan becomes the
//     settled plan: from then on writes are judged by it.
//  3. Only then are the settles published: one per module applied or
//     removed (op apply or remove), or one with an empty module when the
//     plan changed nothing, each naming the plan's stream sequence.
//  4. When what runs changed, a full have is published.
//
// If an apply or removal fails, the remaining rows are not applied, the
// previous plan stays settled (writes are still judged by it) and one
// settle with op failed names the plan, the module and the error. The
// failed plan is tried again 1 s after the failure, doubling to 1 min (at
// most the resync interval), until it succeeds or a newer plan arrives; a
// retry failing the same way publishes nothing, and the one that succeeds
// publishes the plan's settles once.
//
// After a restart the agent has settled nothing until the newest plan is
// applied again (usually a no-op: the runtime already runs it). Its fill
// endpoint is registered before that first apply publishes its settles, so
// a provisioner reacting to them finds a responder, but it answers only
// after that apply: requests during the start wait rather than being
// refused against plan 0.
//
// # Fill requests
//
// The agent serves mesh.<node>.fill as the endpoint "fill" of a NATS micro
// service named "meshfold-node" (metadata node=<node>; `nats micro ls`
// lists it). A request carries the headers Meshfold-Module,
// Meshfold-Path and Meshfold-Writer (events.FillRequest, checked by its
// Validate) and the content as its body; the reply is events.FillReply as
// JSON. The write is judged with reconcile.Judge
// against the settled plan (none settled: plan 0, no account). An accepted
// write goes atomically under the root: a temporary file in the target's
// directory, fsync, chown to the module's account (only when the agent runs
// as root and the account exists as a user), chmod to the declared mode,
// rename, fsync of the directory. Every path's directory is resolved
// inside the root by a walk of held directory descriptors
// (internal/saferoot), and every step after it goes through the held
// directory, never by path: a symlink on the way is followed only in a
// directory no one but root could have written (so a module account's
// link in its own data directory redirects nothing), a path that escapes
// the root, through ".." or a symlink, fails, and a symlink at the file
// itself is replaced, never followed. A path inside the root's
// /.meshfold directory, the agent's own ([ReservedDir]), fails too.
// Each failure is refused as write-failed, the error naming its cause
// (the link not followed, say). Deletes, owner
// and mode changes and the looks at files in place go through the same
// walk (DESIGN.md §8).
//
// The agent then publishes filled (digest = hex HMAC-SHA256 of the
// content under a 32-byte key created once, mode 0600, in the state
// directory) or refusal (with the plan it was judged by and the message id
// <node>.refusal.<plan>.<first 16 hex digits of sha256(module NUL path NUL
// writer)>, so a repeated report of the same refusal is dropped by
// JetStream's duplicate window), and replies once the event is stored. The
// content never reaches a log line, an error or an event.
//
// # Haves
//
// A full have (every module the runtime reports) is published on start,
// whenever what runs changes, and every resync interval (default 10
// minutes); each is retried with exponential backoff until the stream
// acknowledges it or the agent stops. A runtime that implements
// [Supervisor] reports the changes its modules make on their own (an
// exit, a restart), and each brings a have, at most one a second
// ([DefaultHaveEvery]: changes that come faster are folded into the next
// have), so a crash loop shows in the stream but is bounded; a change
// the have does not show brings none. A module's health check that fell
// unhealthy is reported healthy again only once it has passed for the
// hold ([Config.HealthHold], doubling while the check flaps, up to
// [MaxHealthHold]), so a flapping check adds one have, not one per
// transition. The have after an applied plan is never delayed: the
// reconciler judges what runs by it.
//
// # Filled files of removed modules
//
// After every settled plan the agent records, in the state directory
// (module-files.json), the files each module was declared; a module
// removed later, also by a later agent, has its filled files deleted
// under the root, with the temporary files of interrupted writes beside
// them (DESIGN.md §8: a credential does not outlive its module on disk).
// On start, before it serves fills, the agent deletes the temporary files
// interrupted writes left beside every recorded file: an agent killed
// mid-write leaves one, holding the content.
//
// An accepted fill is passed to a [Supervisor] runtime ([Supervisor.Filled])
// before the filled event is published, so a module waiting for its
// credential starts at once.
//
// # Logs
//
// The micro service has a second endpoint, "logs", on
// $MESHFOLD.<prefix>.logs.<node> ([LogsSubject]; the stream does not
// capture it, and only the operator role may request it). A request is
// [LogsRequest] as JSON, the reply [LogsReply]: a page of a module's
// captured output from a runtime that implements [LogReader]. A follow
// is a sequence of requests, each with the previous page's cursor and a
// wait of up to [MaxLogWait] for new output. Log lines never enter the
// stream.
//
// # Plugging in a real engine
//
// [DirRuntime] starts no process: it records each applied module (build,
// account) in a JSON file and reports those records as running. It is for
// demos, tests and dry runs. A real engine (systemd units, containers,
// nix profiles) implements [Runtime]: Apply makes the module run at the
// row's build as the row's account and returns once it runs (or failed);
// Remove stops and forgets it; Running reports what actually runs. Pass it
// as [Config.Runtime].
package node
