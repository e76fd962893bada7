package auth

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/jwt/v2"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// Role is what a user is for; it decides the user's permissions.
type Role string

// The roles. Reconciler, controller and operator are one user each, named
// after the role; node and provisioner are one user per node, named
// node-<node> and provisioner-<node>; system is the system account's
// user, which pushes account updates to running servers.
const (
	RoleReconciler Role = "reconciler"
	RoleController Role = "controller"
	RoleOperator   Role = "operator"
	// RoleOperatorRead is the web console's user (`meshfold console`):
	// everything the operator reads, nothing it may publish.
	RoleOperatorRead Role = "operator-read"
	RoleNode         Role = "node"
	RoleProvisioner  Role = "provisioner"
	RoleSystem       Role = "system"
)

// NodeMaxPayload is the largest message a node user may publish, in
// bytes, headers included: its JWT's payload limit, which nats-server
// enforces on every publish of the connection (a larger one is refused and
// the connection closed with "maximum payload violation"), whatever the
// subject: an event (the stream keeps none over events.MaxEventBytes; the
// largest valid have of plain ASCII encodes to 102 KB) or a page of a
// module's log (256 KiB as encoded), and 16 KiB for headers. Without it a
// node credential could publish 1 MiB messages (the server's default) on
// its lease key and its replies. It bounds a message, not a rate: nats-server
// enforces no per-user byte or message rate (the JWT's data limit is
// not enforced), so what bounds a flooding node's volume is the stream's
// --max-bytes or the account's disk limit, and the reconciler's noisy
// flag (reconcile.Noisy) is how an operator finds it (docs/operations.md,
// "A node that floods the stream"). The provisioner has no such limit:
// a fill request carries up to provision.MaxContent (1 MiB) of content.
// A creds file issued before this limit carries none until reissued
// (auth revoke, then add-node).
const NodeMaxPayload = events.MaxEventBytes + 16<<10

// SystemUser is the name of the system account's user.
const SystemUser = "sys"

// perNode reports whether r has one user per node.
func (r Role) perNode() bool { return r == RoleNode || r == RoleProvisioner }

// UserName returns the user name of role r (for node and provisioner, of
// node's user; for operator, of the operator named node, or the shared
// operator user when node is empty): "reconciler", "node-ace",
// "provisioner-ace", "operator", "operator-alice", "sys".
func UserName(r Role, node string) string {
	switch {
	case r == RoleSystem:
		return SystemUser
	case r.perNode(), r == RoleOperator && node != "":
		return string(r) + "-" + node
	}
	return string(r)
}

// OperatorOf returns the name of the named operator whose user is user
// ("operator-alice": "alice"); "" for any other user, the shared
// "operator" and "operator-read" included.
func OperatorOf(user string) string {
	name, ok := strings.CutPrefix(user, string(RoleOperator)+"-")
	if !ok || user == string(RoleOperatorRead) || !events.ValidName(name) {
		return ""
	}
	return name
}

// checkOperatorName checks the name of a named operator: a valid name
// (it is a subject token) other than "read", which would make the
// console's user name.
func checkOperatorName(name string) error {
	if !events.ValidName(name) {
		return &events.FieldError{Field: "operator", Value: name, Err: events.ErrBadName}
	}
	if UserName(RoleOperator, name) == string(RoleOperatorRead) {
		return fmt.Errorf("operator name %q: %w (its user would be operator-read, the console's)", name, ErrReservedName)
	}
	return nil
}

// Names are the names the permissions are written for: the stream and the
// subject prefix. Zero fields take their defaults (MESH, mesh).
type Names struct {
	Stream string `json:"stream"`
	Prefix string `json:"prefix"`
}

func (n Names) withDefaults() Names {
	if n.Stream == "" {
		n.Stream = store.DefaultStreamName
	}
	if n.Prefix == "" {
		n.Prefix = events.DefaultPrefix
	}
	return n
}

// validate checks n (with its defaults applied).
func (n Names) validate() error {
	if !events.ValidPrefix(n.Prefix) {
		return fmt.Errorf("prefix %q: %w", n.Prefix, events.ErrBadName)
	}
	if strings.ContainsAny(n.Stream, ".*> \t\r\n/\\") {
		return fmt.Errorf("stream name %q: must not contain . * > / \\ or whitespace", n.Stream)
	}
	return nil
}

// The JetStream API subjects the policy is written with (the API of
// nats-server 2.9 and later, as nats.go's jetstream package calls it, on
// the default $JS.API prefix: no JetStream domain).
const jsAPI = "$JS.API"

// Permissions returns the NATS permissions of role r; node names the node
// of a node or provisioner user. Every user may subscribe only to its own
// inbox, InboxPrefixToken+UserName (see store.CredsInboxPrefix), so no
// user reads another's replies. The policy, by role:
//
//   - reconciler: publishes plans, knocks and journal entries of every
//     node, and the agent and prov events it records from the node lease bucket,
//     which it watches (DESIGN.md §11); creates, updates, reads and writes the stream, the snapshot
//     bucket and the lease bucket of reconciler groups (never deletes or
//     purges them); serves the state service.
//   - controller: publishes wants; reads wants and plans (direct gets,
//     consumers filtered to plans); asks the state service's fold
//     endpoint and gets a node's stored snapshot by key (want
//     --dry-run), never the state or composition endpoints nor a list of
//     the snapshot bucket; tells whether a build is in the
//     builds bucket and lists it (its metadata, never its bytes); as the rollout controller (DESIGN.md
//     §11), publishes a fleet's published, refused, tick and record
//     events, reads the whole stream and holds rollout.<fleet> leases.
//   - operator: publishes approvals, the operator events of DESIGN.md
//     §9 (pause, resume, poke, revoke, waive, retire) and acks of a
//     node's warnings (issue 25), and no other role may: the shared
//     operator user (node empty) on their plain subjects, whose `by` is
//     self-declared; a named operator (operator-<name>, node being the
//     name) only on their named subjects that end in its own name
//     (events.Subjects.Named), never on the plain ones, so the server
//     checks the name an event's subject gives (docs/architecture.md,
//     "Operators named in the subject"); starts rollouts and gives their verbs (a fleet's start,
//     nodes, promote, pause, resume, abort, revert; a named operator its verbs only on the
//     fleets' named subjects that end in its name, events.Subjects.NamedRollout, while
//     start and nodes, apply's, stay plain); reads everything in the stream and
//     the snapshot bucket, asks the state service and subscribes to the
//     live plain subjects, except the fill subjects (never: they carry
//     secrets); pushes, lists and removes module bundles in the builds
//     bucket (<stream>_BUILDS), creating it on the first push.
//   - operator-read: the operator's reads and nothing else: the stream
//     and the snapshot bucket (consumers, direct gets, stream info), the
//     state service, and whether a build is in the builds bucket. It publishes no event (not even an approval),
//     subscribes to no live subject and never to the fill subjects, and
//     may not ask a node agent for logs: the web console connects with
//     it, so a console that leaks its creds file leaks no write and no
//     secret.
//   - node (node-N): publishes N's have, settle, refusal and filled only;
//     serves N's logs endpoint ($MESHFOLD.<prefix>.logs.N, which only the
//     operator may request: module output is for operators);
//     reads N's newest plan and creates consumers filtered to N's plan
//     only; serves N's fill subject; reads bundles of the builds bucket
//     (not their list, never a write).
//   - provisioner (provisioner-N): sends requests on N's fill subject;
//     reads N's newest plan, knock and settle, and creates consumers
//     filtered to N's knock or N's settle only (it fills on every knock,
//     and a plan's new files once the node settles it); reads and
//     watches N's sealed secrets only (keys N.>) and registers N's curve
//     key (N.curve-key) in <stream>_SECRETS; writes and reads N's fill
//     statuses in <stream>_FILLS (DESIGN.md §12); holds its lease, the
//     key <N>.provisioner of the node lease bucket.
//
// The secrets bucket: operators put, list and remove (and create it);
// the reconciler creates it; a node's provisioner reads its own node's;
// nobody else reads it (node agents, controllers, the console, other
// nodes' provisioners). The fill statuses: operator and operator-read
// read them.
//   - system: no restriction inside the system account (account updates).
//
// Discovery (nats.go micro's $SRV subjects): the node agent and the
// reconciler, which serve micro services, subscribe to their own
// service's discovery subjects and to the unnamed $SRV.PING, $SRV.INFO
// and $SRV.STATS every micro service answers, each spelled out: no user
// may subscribe to $SRV.> (a fresh user's finding m4). Only the operator
// sends discovery requests (`nats micro ls`).
//
// JetStream API access is scoped by subject: consumer creation only on
// the filtered form $JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>,
// whose filter the server checks against the request's, and direct gets
// only in the $JS.API.DIRECT.GET.<stream>.<subject> form, where the
// server refuses a body that asks for another subject. Partition tokens
// are wildcards: a node's events are stored only in its own partition,
// so the permissions do not depend on the partition count.
//
// Known limits (subjects cannot express them): every role may read the
// stream's info, whose subject listing can name other nodes and count
// their events (never their content); pulling from, asking the info of
// (its filter and counts, never a message) and deleting a consumer are
// allowed by stream (consumer names are random and unlisted to nodes);
// and any role that may create a consumer chooses its deliver subject
// and group (the server checks neither), which meshfold's services meet
// by answering only core requests
// (store.CoreRequestsOnly). A node agent's service instance id is
// random, so a node user may subscribe to the discovery subjects of
// another agent's instance ($SRV.INFO.meshfold-node.<id>) and answer
// them: discovery only, where no event, state or filled content flows.
func Permissions(r Role, node string, names Names) (jwt.Permissions, error) {
	n := names.withDefaults()
	if err := n.validate(); err != nil {
		return jwt.Permissions{}, err
	}
	if r.perNode() && !events.ValidName(node) {
		return jwt.Permissions{}, &events.FieldError{Field: "node", Value: node, Err: events.ErrBadName}
	}
	if r == RoleOperator && node != "" {
		if err := checkOperatorName(node); err != nil {
			return jwt.Permissions{}, err
		}
	}
	var p jwt.Permissions
	user := UserName(r, node)
	p.Sub.Allow.Add(store.InboxPrefixToken + user + ".>")

	s, pre := n.Stream, n.Prefix
	kv := "KV_" + s + store.SnapshotBucketSuffix
	bucket := s + store.SnapshotBucketSuffix
	leases := s + leaseBucketSuffix
	keys := s + store.EffectKeyBucketSuffix  // the reconcilers' effect-id key: theirs alone
	nodes := s + store.NodeLeaseBucketSuffix // node agents' leases, keyed by node
	nodesKV := "KV_" + nodes
	api := func(format string, args ...any) string { return jsAPI + "." + fmt.Sprintf(format, args...) }
	// readStream: looking the stream up, following consumers, asking
	// a consumer one follows for its info (a tail asks it after two
	// missed heartbeats, to tell a consumer that lives from one lost
	// with its server: store.Tail; refused, a node's and a
	// provisioner's feeds were deaf ~12 s after every server restart
	// and the server logged a permissions violation a feed), deleting
	// the consumers one made.
	readStream := func(stream string) {
		p.Pub.Allow.Add(api("STREAM.INFO.%s", stream), api("CONSUMER.MSG.NEXT.%s.*", stream),
			api("CONSUMER.INFO.%s.*", stream), api("CONSUMER.DELETE.%s.*", stream))
	}
	subj := func(node, kind string) string { return pre + "." + node + "." + kind }
	rolloutSubj := func(kind string) string { return events.Subjects{Prefix: pre}.Rollout("*", kind) }
	// stored is a stored-subject filter; the partition token is a wildcard.
	stored := func(node, kind string) string { return "*." + subj(node, kind) }
	// service: the discovery subjects a micro service named name
	// answers ($SRV.<verb>, $SRV.<verb>.<name>, $SRV.<verb>.<name>.<id>),
	// each verb spelled out. A "$SRV.*" would let the user subscribe to
	// "$SRV.>" as well (the server matches a subscription's subject
	// against the allow list token by token, "*" taking the ">"), and
	// so take every service's discovery requests and answer them as any
	// service (a fresh user's finding m4).
	service := func(name string) {
		for _, v := range discoveryVerbs {
			p.Sub.Allow.Add("$SRV."+v, "$SRV."+v+"."+name, "$SRV."+v+"."+name+".*")
		}
	}
	respond := func() { p.Resp = &jwt.ResponsePermission{MaxMsgs: 1} }
	// The builds bucket (an object store: stream OBJ_<bucket>, chunks on
	// $O.<bucket>.C.<nuid>, metadata on $O.<bucket>.M.<name>), read as
	// nats.go's object store reads: the stream's info, a direct get of an
	// object's metadata, an ordered push consumer over its chunks (with
	// flow-control replies). list adds a consumer over the metadata.
	builds := s + buildsBucketSuffix
	objStream, obj := "OBJ_"+builds, "$O."+builds
	// statBuilds: whether a bundle is stored (its metadata), never its
	// bytes: what `meshfold want` checks before publishing (issue 25).
	statBuilds := func() {
		p.Pub.Allow.Add(api("STREAM.INFO.%s", objStream), api("DIRECT.GET.%s.%s.M.>", objStream, obj))
	}
	readBuilds := func(list bool) {
		p.Pub.Allow.Add(api("STREAM.INFO.%s", objStream), api("DIRECT.GET.%s.%s.M.>", objStream, obj),
			api("CONSUMER.CREATE.%s.*.%s.C.*", objStream, obj), api("CONSUMER.DELETE.%s.*", objStream),
			"$JS.FC."+objStream+".>")
		if list {
			p.Pub.Allow.Add(api("CONSUMER.CREATE.%s.*.%s.M.>", objStream, obj))
		}
	}

	// The sealed secrets bucket (DESIGN.md §12) and the fill statuses:
	// KV buckets, read as nats.go reads one (the stream's info, direct
	// gets of a key, ordered push consumers over a filter with flow
	// control) and written by publishing on $KV.<bucket>.<key>.
	secrets, fills := s+store.SecretsBucketSuffix, s+store.FillStatusBucketSuffix
	readKV := func(bucket, keys string) {
		st := "KV_" + bucket
		p.Pub.Allow.Add(api("STREAM.INFO.%s", st), api("DIRECT.GET.%s.$KV.%s.%s", st, bucket, keys),
			api("CONSUMER.CREATE.%s.*.$KV.%s.%s", st, bucket, keys), api("CONSUMER.DELETE.%s.*", st),
			"$JS.FC."+st+".>")
	}

	// snapshotsFC: the flow-control replies of a KV watch over the
	// snapshot bucket (store.Snapshots.LoadAll: fleet, the console), an
	// ordered push consumer; without them the server stops delivering
	// after its first 2 MiB window (TestReadsPastFlowControl). The
	// reconciler is granted its watches' replies (below), not only its
	// response permission (respond, any reply subject of a message it
	// received), so that a stalled consumer's heartbeat, whose
	// flow-control subject is not the reply of a message it received, is
	// answered. Node agents need no grant but the builds bucket's
	// (readBuilds): they follow their plans with a pull consumer, which
	// has no flow control, and read their lease with direct gets
	// (TestNodeFlowControlGrants).
	snapshotsFC := "$JS.FC." + kv + ".>"

	// readLeases: the reconcilers' and the rollout controllers' leases
	// (<stream>_LEASES: who holds each partition and each fleet's
	// controller, and when it last renewed), read with direct gets,
	// never written: the rollout views say a partition or a fleet has
	// no live holder (query.Reader.Holders; a fresh user's findings M4
	// and m2). The values name a group, an instance, a host and a pid.
	readLeases := func() {
		p.Pub.Allow.Add(api("STREAM.INFO.KV_%s", leases), api("DIRECT.GET.KV_%s.$KV.%s.>", leases, leases))
	}

	switch r {
	case RoleReconciler:
		// It creates the secrets and fill status buckets, and reads neither.
		for _, b := range []string{secrets, fills} {
			p.Pub.Allow.Add(api("STREAM.INFO.KV_%s", b), api("STREAM.CREATE.KV_%s", b))
		}
		p.Pub.Allow.Add(subj("*", "plan"), subj("*", "knock"), subj("*", "journal"), subj("*", string(events.KindAgent)), subj("*", string(events.KindProv)),
			"$KV."+bucket+".>", "$KV."+leases+".>", "$KV."+keys+".>", api("INFO"),
			// Its agent liveness watch's pulse (store.NodeLeasePulseKey):
			// no node's lease.
			"$KV."+nodes+"."+store.NodeLeasePulseKey,
			// Its KV watches (a partition's states, the group's and
			// the agents' leases) answer flow control.
			snapshotsFC, "$JS.FC.KV_"+leases+".>", "$JS.FC."+nodesKV+".>")
		for _, st := range []string{s, kv, "KV_" + leases, nodesKV, "KV_" + keys} {
			readStream(st)
			p.Pub.Allow.Add(api("STREAM.CREATE.%s", st), api("STREAM.UPDATE.%s", st), api("STREAM.MSG.GET.%s", st),
				api("DIRECT.GET.%s", st), api("DIRECT.GET.%s.>", st),
				api("CONSUMER.CREATE.%s.>", st), api("CONSUMER.INFO.%s.*", st))
		}
		p.Sub.Allow.Add(events.StateSubject(pre, events.EndpointState, "*"), events.StateSubject(pre, events.EndpointComposition, "*"),
			events.StateSubject(pre, events.EndpointFold, "*"))
		service(events.StateServiceName)
		respond()
	case RoleController:
		readStream(s)
		// The rollout controller (DESIGN.md §11): its facts on the
		// fleets' subjects, the whole stream read from a start, and its
		// fleets' leases in the lease bucket.
		for _, k := range rolloutController {
			p.Pub.Allow.Add(rolloutSubj(k))
		}
		readStream("KV_" + leases)
		// The message get ($JS.API.STREAM.MSG.GET, answered by the
		// stream's leader; store.LeaderReads) for what it decides from
		// a message written a moment ago: no more than its consumers
		// over the whole stream already read.
		p.Pub.Allow.Add(api("CONSUMER.CREATE.%s.>", s), api("DIRECT.GET.%s.%s", s, rolloutSubj("*")), api("DIRECT.GET.%s", s),
			api("STREAM.MSG.GET.%s", s),
			api("DIRECT.GET.KV_%s.$KV.%s.rollout.>", leases, leases), "$KV."+leases+".rollout.>")
		// want and apply refuse a build nobody pushed, naming the
		// stored builds nearest to it: the bucket's metadata, listed,
		// never a bundle's bytes.
		statBuilds()
		p.Pub.Allow.Add(api("CONSUMER.CREATE.%s.*.%s.M.>", objStream, obj), api("CONSUMER.DELETE.%s.*", objStream), "$JS.FC."+objStream+".>")
		p.Pub.Allow.Add(subj("*", "want"),
			api("DIRECT.GET.%s.%s", s, stored("*", "want")), api("DIRECT.GET.%s.%s", s, stored("*", "plan")),
			api("CONSUMER.CREATE.%s.*.%s", s, stored("*", "plan")))
		// want --dry-run (a CI job checks its want before publishing
		// it): the reconciler's state service's fold endpoint, else,
		// with no reconciler answering, a node's stored snapshot, read
		// by key (never listed, never written). A state is the fold of
		// the node's events, which this role already reads whole from
		// the stream (above), and holds no filled-file content: the
		// grant adds no knowledge, only the node's history past
		// --max-age (docs/architecture.md, "The controller's dry run";
		// a fresh user's finding M12).
		p.Pub.Allow.Add(events.StateSubject(pre, events.EndpointFold, "*"),
			api("STREAM.INFO.%s", kv), api("DIRECT.GET.%s.$KV.%s.node.>", kv, bucket))
	case RoleOperator:
		readStream(s)
		readStream(kv)
		for _, k := range events.OperatorKinds {
			if node == "" {
				p.Pub.Allow.Add(subj("*", string(k)))
				continue
			}
			// Its own name's named subjects only: *.<prefix>.*.<kind>.<name>
			// (the partition token is the publisher's to compute; the
			// fold refuses an event outside its node's partition).
			p.Pub.Allow.Add(stored("*", string(k)) + "." + node)
		}
		for _, k := range rolloutOperator {
			if node == "" || !slices.Contains(rolloutVerbs, k) {
				p.Pub.Allow.Add(rolloutSubj(k))
				continue
			}
			// A named operator's rollout verbs: on the fleets' named
			// subjects that end in its name only,
			// <prefix>.rollout.*.<kind>.<name> (events.Subjects.NamedRollout).
			p.Pub.Allow.Add(rolloutSubj(k) + "." + node)
		}
		p.Pub.Allow.Add(api("INFO"), api("STREAM.NAMES"), api("STREAM.LIST"),
			api("STREAM.MSG.GET.%s", s), api("DIRECT.GET.%s", s), api("DIRECT.GET.%s.>", s),
			api("CONSUMER.CREATE.%s.>", s), api("CONSUMER.INFO.%s.*", s),
			api("CONSUMER.NAMES.%s", s), api("CONSUMER.LIST.%s", s),
			api("DIRECT.GET.%s.>", kv), api("CONSUMER.CREATE.%s.>", kv), api("CONSUMER.INFO.%s.*", kv),
			snapshotsFC, api("STREAM.INFO.%s", nodesKV), api("DIRECT.GET.%s.>", nodesKV),
			events.StateSubjectRoot+"."+pre+".>", "$SRV.>")
		readLeases()
		// Bundles: push (creating the bucket on the first), list, remove.
		readBuilds(true)
		p.Pub.Allow.Add(api("STREAM.CREATE.%s", objStream), api("STREAM.PURGE.%s", objStream), obj+".>")
		// Sealed secrets: put (creating the bucket on the first), list,
		// remove; the fill statuses: read.
		readKV(secrets, ">")
		p.Pub.Allow.Add(api("STREAM.CREATE.KV_%s", secrets), "$KV."+secrets+".>")
		readKV(fills, ">")
		// Live events, never the fill subjects.
		p.Sub.Allow.Add(pre + ".>")
		p.Sub.Deny.Add(subj("*", "fill"))
		p.Pub.Deny.Add(subj("*", "fill"))
	case RoleOperatorRead:
		readStream(s)
		readStream(kv)
		p.Pub.Allow.Add(api("INFO"), api("STREAM.MSG.GET.%s", s), api("DIRECT.GET.%s", s), api("DIRECT.GET.%s.>", s),
			api("CONSUMER.CREATE.%s.>", s), api("CONSUMER.INFO.%s.*", s),
			api("DIRECT.GET.%s.>", kv), api("CONSUMER.CREATE.%s.>", kv), api("CONSUMER.INFO.%s.*", kv), snapshotsFC,
			events.StateSubject(pre, events.EndpointState, "*"), events.StateSubject(pre, events.EndpointComposition, "*"))
		readKV(fills, ">") // why files are unfilled; never the secrets
		statBuilds()       // whether a want's builds were pushed
		readLeases()
		p.Pub.Deny.Add(subj("*", "fill"))
		p.Sub.Deny.Add(subj("*", "fill"))
	case RoleNode:
		readStream(s)
		for _, k := range []events.Kind{events.KindHave, events.KindSettle, events.KindRefusal, events.KindFilled} {
			p.Pub.Allow.Add(subj(node, string(k)))
		}
		p.Pub.Allow.Add(api("DIRECT.GET.%s.%s", s, stored(node, "plan")),
			api("CONSUMER.CREATE.%s.*.%s", s, stored(node, "plan")))
		// Its own newest agent event (the reconciler's record of its
		// liveness), which an agent that claimed its expired lease again
		// reads to publish a have after the down (node.answerReclaim; a
		// fresh user's finding F5: refused, it logged a permissions
		// violation every 2.5 s after each serve restart). Never another
		// node's.
		p.Pub.Allow.Add(api("DIRECT.GET.%s.%s", s, stored(node, string(events.KindAgent))))
		// Its own lease, never another node's.
		p.Pub.Allow.Add(api("STREAM.INFO.%s", nodesKV), "$KV."+nodes+"."+node, api("DIRECT.GET.%s.$KV.%s.%s", nodesKV, nodes, node))
		readBuilds(false) // fetch the bundles its modules run
		p.Sub.Allow.Add(subj(node, "fill"), events.StateSubject(pre, events.EndpointLogs, node))
		service(nodeServiceName)
		respond()
	case RoleProvisioner:
		readStream(s)
		p.Pub.Allow.Add(subj(node, "fill"))
		for _, k := range []string{"plan", "knock", "settle"} {
			p.Pub.Allow.Add(api("DIRECT.GET.%s.%s", s, stored(node, k)))
		}
		for _, k := range []string{"knock", "settle"} {
			p.Pub.Allow.Add(api("CONSUMER.CREATE.%s.*.%s", s, stored(node, k)))
		}
		// Its own node's sealed secrets only (read and watch), and its
		// curve key's registration; its node's fill statuses.
		readKV(secrets, node+".>")
		p.Pub.Allow.Add("$KV." + secrets + "." + store.CurveKeyName(node))
		readKV(fills, node+".>")
		p.Pub.Allow.Add("$KV." + fills + "." + node + ".>")
		// Its own lease (docs/design.md §11), never the node agent's nor
		// another provisioner's.
		lease := store.ProvisionerLeaseKey(node)
		p.Pub.Allow.Add(api("STREAM.INFO.%s", nodesKV), "$KV."+nodes+"."+lease, api("DIRECT.GET.%s.$KV.%s.%s", nodesKV, nodes, lease))
	case RoleSystem:
		return jwt.Permissions{}, nil
	default:
		return jwt.Permissions{}, fmt.Errorf("role %q: %w", r, ErrUnknownRole)
	}
	return p, nil
}

// A fleet's rollout kinds (package rollout's, repeated here: rollout's
// vocabulary is not store's): the operator starts rollouts (`meshfold
// apply`: start and its nodes pages) and gives the verbs; the controller
// records the server's answers, the ticks and the fold's records.
var (
	rolloutOperator   = []string{"start", "nodes", "promote", "pause", "resume", "abort", "revert"}
	rolloutVerbs      = []string{"promote", "pause", "resume", "abort", "revert"} // rolloutOperator's verbs: named for a named operator
	rolloutController = []string{"published", "refused", "tick", "record"}
)

// leaseBucketSuffix names the reconciler group's lease bucket beside the
// stream (MESH → MESH_LEASES), where reconcilers sharing partitions keep
// their leases.
const leaseBucketSuffix = "_LEASES"

// buildsBucketSuffix names the object store bucket of module bundles
// beside the stream (MESH → MESH_BUILDS; bundle.BucketSuffix, repeated
// here so that store does not import node, and TestBuildsBucketSuffix
// keeps the two equal).
const buildsBucketSuffix = "_BUILDS"

// discoveryVerbs are the verbs of nats.go micro's discovery subjects
// (micro.PingVerb, StatsVerb, InfoVerb), which every service answers.
var discoveryVerbs = []string{"PING", "INFO", "STATS"}

// nodeServiceName is the micro service name of the node agent
// (node.ServiceName; package node imports store, so it is repeated here
// and TestNodeServiceName keeps the two equal).
const nodeServiceName = "meshfold-node"
