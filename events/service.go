package events

// The state service (DESIGN.md §6, `meshfold state`): a NATS micro
// service named "meshfold" with two endpoints, so `nats micro ls` and
// `nats micro info meshfold` find it:
//
//	state        $MESHFOLD.<prefix>.state.<node>        → reconcile.View
//	composition  $MESHFOLD.<prefix>.composition.<node>  → reconcile.Composition
//
// The node is the subject's last token (the request body is ignored), so
// NATS permissions can allow an operator some nodes and not others. The
// reply is JSON; an error reply carries the micro error headers
// (Nats-Service-Error-Code): 400 for a bad node name, 404 for a node the
// reconciler has never folded an event of. Replies hold no secret: the
// state holds paths, accounts and sequences, never filled-file content.
const (
	StateServiceName    = "meshfold"
	StateServiceVersion = "0.1.0"
	// StateSubjectRoot is the first token of the service's subjects.
	StateSubjectRoot = "$MESHFOLD"
	// EndpointState and EndpointComposition name the endpoints.
	EndpointState       = "state"
	EndpointComposition = "composition"
	// EndpointLogs is the node agent's endpoint of a module's captured
	// output (DESIGN.md §8), $MESHFOLD.<prefix>.logs.<node>, served by the
	// node's agent (service "meshfold-node"), not by the reconciler.
	EndpointLogs = "logs"
	// EndpointFold returns the node's whole folded state (reconcile.State,
	// the snapshot form): what `meshfold want --dry-run` composes from.
	EndpointFold = "fold"
	// MetaNamedOperators is the state service's metadata key that says
	// its reconciler folds named operator events ([Subjects.Named]),
	// value "1". A reconciler of a build before them has no such key,
	// and refuses a stream that captures them: `meshfold auth
	// add-operator` asks the state services before it makes the stream
	// capture them.
	MetaNamedOperators = "named_operators"
	// MetaNamedRollouts is the state service's metadata key that says its
	// process folds named operators' rollout verbs
	// ([Subjects.NamedRollout]: its rollout controller reads them, and its
	// reconciler starts on a stream that captures them), value "1". A
	// build before them (which may say [MetaNamedOperators]) refuses a
	// stream that captures <prefix>.rollout.*.*.*, and its controller
	// does not see the verbs: `meshfold auth enable-named` asks for this
	// key before it adds that pattern.
	MetaNamedRollouts = "named_rollouts"
)

// StateSubject returns the subject of endpoint for node under prefix
// ("" means "mesh"): $MESHFOLD.<prefix>.<endpoint>.<node>.
func StateSubject(prefix, endpoint, node string) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return StateSubjectRoot + "." + prefix + "." + endpoint + "." + node
}
