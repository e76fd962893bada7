package main

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/spf13/cobra"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
)

// violation parses the server's permission error: "Permissions Violation
// for Publish to "S"" or "... for Subscription to "S"".
var violation = regexp.MustCompile(`for (Publish|Subscription) to "([^"]+)"`)

// explainOversized says what the server's "maximum message size
// exceeded" (10054) means for any verb: the event is over the event
// limit the stream enforces, and nothing was stored (DESIGN.md §10).
func explainOversized(err error) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamMessageExceedsMaximum {
		return err
	}
	return fmt.Errorf("refused by the server: the message is over the stream's maximum message size, the event limit of %d bytes (events.MaxEventBytes, DESIGN.md §10, headers included); nothing was stored: %w",
		store.MaxMsgSize, err)
}

// jsReplicasNotSupported is the server's "replicas > 1 not supported in
// non-clustered mode" (nats-server's JSStreamReplicasNotSupportedErr;
// nats.go has no sentinel for it).
const jsReplicasNotSupported = 10074

// explainReplicas says what to do about --replicas above 1 against a
// server that is not clustered, which refuses the stream's (or a
// bucket's) creation or update: a flag that does not fit the server,
// exit 2, in one line naming the flag and, for reconcile, where the
// packaged units set it (reconcile.env's --replicas 3 is for the
// documented cluster of three; against one server it gave a bare NATS
// error restarted every 2 s: a fresh user's finding m1 of fresh10).
func (a *app) explainReplicas(cmd *cobra.Command, err error) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jsReplicasNotSupported {
		return err
	}
	given := "--replicas above 1"
	if cmd != nil {
		if f := cmd.Flags().Lookup("replicas"); f != nil && f.Changed {
			given = "--replicas " + f.Value.String()
		}
	}
	msg := given + ": the server is not clustered, and keeps one replica of a stream: give --replicas 1 (or none: 0 keeps the stream's), or connect to a cluster"
	if cmd != nil && cmd.Name() == "reconcile" {
		msg += "; the packaged meshfold-reconcile@ units take it from MESHFOLD_RECONCILE_ARGS in /etc/meshfold/reconcile.env (or reconcile-NAME.env), whose --replicas 3 is for a cluster of three servers"
	}
	if a.logLevel == "debug" {
		msg += " (" + err.Error() + ")"
	}
	return withCode(exitUsage, &quietErr{msg: msg, err: err})
}

// explainStream says what to do about an existing stream the flags do
// not fit, in the flags' terms: another prefix is one line naming the
// stream's ("stream MESH was created with prefix "mesh": give --prefix
// mesh, …"), not the 900 characters of both transforms and all subjects
// a fresh user met (U24), which --log-level debug still adds; another
// partition count says how to adopt the stream's.
func (a *app) explainStream(err error) error {
	var ie *store.IncompatibleError
	if !errors.As(err, &ie) {
		return err
	}
	var msg string
	switch {
	case ie.Prefix != "":
		msg = fmt.Sprintf("stream %s was created with prefix %q: give --prefix %s, or a new --stream for another prefix",
			ie.Stream, ie.Prefix, ie.Prefix)
	case ie.Partitions != 0 && len(ie.Diffs) == 1:
		msg = fmt.Sprintf("stream %s has %d partitions, fixed for its life, not %d: drop --partitions, or 0 adopts the stream's",
			ie.Stream, ie.Partitions, ie.AskedPartitions)
	default:
		return err
	}
	if a.logLevel == "debug" {
		msg += " (" + strings.Join(ie.Diffs, "; ") + ")"
	}
	return &quietErr{msg: msg, err: err}
}

// watchDenied makes a permission violation on nc end the command at once
// (a JetStream request denied is otherwise waited out until its timeout)
// and keeps the first for run to explain. It chains nc's error and closed
// handlers, but not for a violation: run explains it once, so the raw
// "nats async error" and "nats connection closed" log lines of it would
// only say it again.
func (a *app) watchDenied(nc *nats.Conn) { a.watchDeniedUntil(nc, nil) }

// watchDeniedUntil is watchDenied until until is closed (nil: for good);
// after that a violation goes to nc's handlers as before. A long-running
// role (meshfold node) watches its start only: a permission its creds
// lack when it claims its lease is no transient failure to retry for
// ever (a fresh user's finding 6: a node given a provisioner's creds
// retried every 5 s without end).
func (a *app) watchDeniedUntil(nc *nats.Conn, until <-chan struct{}) {
	prev := nc.ErrorHandler()
	nc.SetErrorHandler(func(c *nats.Conn, s *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) && !closedChan(until) && !a.spared(err) {
			if a.askRefused(err) {
				return
			}
			a.deniedMu.Lock()
			if a.denied == nil {
				a.denied = err
			}
			a.deniedMu.Unlock()
			if a.cancel != nil {
				a.cancel(err)
			}
			return
		}
		if prev != nil {
			prev(c, s, err)
		}
	})
	prevClosed := nc.ClosedHandler()
	nc.SetClosedHandler(func(c *nats.Conn) {
		if errors.Is(c.LastError(), nats.ErrPermissionViolation) && (a.deniedErr() != nil || a.askWasRefused()) {
			return
		}
		if prevClosed != nil {
			prevClosed(c)
		}
	})
}

// spared reports whether err, a permission violation, is one the
// command carries on without (app.deniedSpared): it then goes to the
// connection's handlers as before, not ending the command.
func (a *app) spared(err error) bool {
	if a.deniedSpared == nil {
		return false
	}
	m := violation.FindStringSubmatch(err.Error())
	return m != nil && a.deniedSpared(m[2])
}

// askRefused takes a permission violation that belongs to a question a
// verb asks only to learn more, not to do its work: one on the
// reconciler's state service subjects ($MESHFOLD.<prefix>.state.* and
// .composition.*), whenever it comes, and any while stateKnows asks
// (its fallback reads the snapshot bucket). It ends that question, which
// then reads as unknown, and not the command: the controller role may not
// ask the state service (store/auth), and `want NODE` of a node whose
// events aged out failed on it with a permission error. It reports
// whether it took err.
func (a *app) askRefused(err error) bool {
	subject := ""
	if m := violation.FindStringSubmatch(err.Error()); m != nil {
		subject = m[2]
	}
	a.deniedMu.Lock()
	defer a.deniedMu.Unlock()
	root := events.StateSubjectRoot + "." + cmp.Or(a.stream.prefix, events.DefaultPrefix) + "."
	state := strings.HasPrefix(subject, root+events.EndpointState+".") || strings.HasPrefix(subject, root+events.EndpointComposition+".") ||
		strings.HasPrefix(subject, root+events.EndpointFold+".")
	if a.asking == nil && !state {
		return false
	}
	if a.askDenied == "" {
		a.askDenied = cmp.Or(subject, err.Error())
	}
	if a.asking != nil {
		a.asking(err)
	}
	return true
}

// askWasRefused reports whether askRefused took a violation: stateKnows
// said it, and the connection's close need not say it again.
func (a *app) askWasRefused() bool {
	a.deniedMu.Lock()
	defer a.deniedMu.Unlock()
	return a.askDenied != ""
}

// closedChan reports whether c is closed; a nil c never is.
func closedChan(c <-chan struct{}) bool {
	if c == nil {
		return false
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// credsMayPublish reports whether the user JWT of the creds file at
// path lets its user publish on subject (auth.Allows over its publish
// permissions); false when the file cannot be read as creds. What the
// server will say, read ahead from the creds themselves: the creds of a
// named operator issued before its rollout verbs were named allow the
// plain rollout subjects only.
func credsMayPublish(path, subject string) bool {
	data, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	tok, err := nkeys.ParseDecoratedJWT(data)
	if err != nil {
		return false
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return false
	}
	return auth.Allows(uc.Permissions.Pub, subject)
}

// credsUser returns the user name in the creds file at path and the role
// it is of (auth.UserName's names: "node-ace" is a node's, "operator" the
// operator's); "" when the file has no readable user JWT. Decoded, not
// verified: it only says which creds were given.
func credsUser(path string) (user string, role auth.Role) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", ""
	}
	tok, err := nkeys.ParseDecoratedJWT(data)
	if err != nil {
		return "", ""
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil || uc.Name == "" {
		return "", ""
	}
	switch {
	case uc.Name == auth.SystemUser:
		return uc.Name, auth.RoleSystem
	case strings.HasPrefix(uc.Name, string(auth.RoleNode)+"-"):
		return uc.Name, auth.RoleNode
	case strings.HasPrefix(uc.Name, string(auth.RoleProvisioner)+"-"):
		return uc.Name, auth.RoleProvisioner
	case auth.OperatorOf(uc.Name) != "":
		return uc.Name, auth.RoleOperator
	}
	return uc.Name, auth.Role(uc.Name)
}

// issuedWithout reports whether the user of the creds file at path is
// one this build grants subject (auth.Grants, for its role and node) but
// whose JWT does not (auth.Allows): its creds were issued by an older
// build, before its role had the right.
func issuedWithout(path, subject string, sub bool, names auth.Names) bool {
	data, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	tok, err := nkeys.ParseDecoratedJWT(data)
	if err != nil {
		return false
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return false
	}
	user, role := credsUser(path)
	if role == "" || role == auth.RoleSystem {
		return false
	}
	node := ""
	if role == auth.RoleNode || role == auth.RoleProvisioner {
		node = strings.TrimPrefix(user, string(role)+"-")
	}
	held := uc.Pub
	if sub {
		held = uc.Sub
	}
	return auth.Grants(role, node, subject, sub, names) && !auth.Allows(held, subject)
}

// urlUser returns the user name of the first of servers (a --server
// list) that names one with a password (nats://USER:PASSWORD@HOST), ""
// when none does: for a server whose users are in its config, not in
// creds files. A URL's user without a password is a token, a secret, and
// is never returned.
func urlUser(servers string) string {
	for s := range strings.SplitSeq(servers, ",") {
		u, err := url.Parse(strings.TrimSpace(s))
		if err != nil || u.User == nil {
			continue
		}
		if _, hasPassword := u.User.Password(); hasPassword && u.User.Username() != "" {
			return u.User.Username()
		}
	}
	return ""
}

// commandDenied returns the permission violation that ended the command
// whose error is err: the first the connection's error handler kept
// (watchDenied), or else err itself when it is one. store's publishes
// and guarded requests fail with the violation from the same handler
// chain, and the command can return before watchDenied's handler has
// kept it: under load a denied poke then printed the server's raw
// "permissions violation" instead of its explanation.
func (a *app) commandDenied(err error) error {
	if d := a.deniedErr(); d != nil {
		return d
	}
	if errors.Is(err, nats.ErrPermissionViolation) {
		return err
	}
	return nil
}

func (a *app) deniedErr() error {
	a.deniedMu.Lock()
	defer a.deniedMu.Unlock()
	return a.denied
}

// explainDenied says which role would be allowed what the server denied,
// and what the command was for (issue 25: errors that explain).
func (a *app) explainDenied(cmd *cobra.Command, denied error) error {
	m := violation.FindStringSubmatch(denied.Error())
	what := "meshfold"
	purpose := ""
	if cmd != nil {
		what, purpose = cmd.CommandPath(), strings.TrimSuffix(cmd.Short, ".")
	}
	if m == nil {
		return fmt.Errorf("%s: permission denied by the server: %v", what, denied)
	}
	op := "publish to"
	if m[1] == "Subscription" {
		op = "subscribe to"
	}
	names := auth.Names{Stream: a.stream.name, Prefix: a.stream.prefix}
	roles := auth.AllowedRoles(m[2], m[1] == "Subscription", names)
	user, role := "", auth.Role("")
	if path := a.conn.withEnv().creds; path != "" {
		user, role = credsUser(path)
	}
	refused := "these credentials may not " + op + " " + m[2]
	if kind, subject := verbSubject(cmd, a.stream.prefix); kind != "" {
		// A verb's reads before its publish (is the node known, retired,
		// paused?) are refused first to a role that may not publish it:
		// the right that role lacks is the verb's own, not the read's,
		// whose roles include some the verb is refused to (a fresh
		// user's finding V4: a controller's approve named the operator,
		// operator-read and reconciler roles that may read a retire).
		if vroles := auth.AllowedRoles(subject, false, names); role == "" || !slices.Contains(vroles, role) {
			roles = vroles
			who := "these credentials"
			if role != "" {
				who = "the " + string(role) + " role"
			}
			refused = fmt.Sprintf("%s may not %s (publish to %s)", who, kind, subject)
		}
	}
	who := "no meshfold role may"
	switch len(roles) {
	case 0:
	case 1:
		who = fmt.Sprintf("only the %s role may", roles[0])
	default:
		names := make([]string, len(roles))
		for i, r := range roles {
			names[i] = string(r)
		}
		who = "only the roles " + strings.Join(names, ", ") + " may"
	}
	given := ""
	if user != "" {
		given = fmt.Sprintf("; the creds given (%s) are user %s's, of the %s role", a.conn.withEnv().creds, user, role)
	} else if u := urlUser(a.conn.withEnv().server); u != "" {
		given = fmt.Sprintf("; the user given (in the server URL) is %s", u)
	}
	if a.deniedNeeds != "" {
		who = a.deniedNeeds
	}
	if path := a.conn.withEnv().creds; path != "" && issuedWithout(path, m[2], m[1] == "Subscription", names) {
		// This build grants the creds' own user what the server denied:
		// they were issued by an older build (a user's permissions are
		// fixed in its JWT when issued), before the role had the right
		// (the operator's mesh.*.gate came with approval gates).
		return fmt.Errorf("%s (%s): permission denied: %s; the %s role may in this build, but the creds given (%s, user %s's) were issued by an older build, "+
			"and a user's permissions are fixed when it is issued: issue them again (meshfold auth revoke %s --dir DIR, then meshfold auth add-user %s --dir DIR) and use the new creds",
			what, purpose, refused, role, a.conn.withEnv().creds, user, user, role)
	}
	return fmt.Errorf("%s (%s): permission denied: %s; %s: connect with such a user's creds (--creds, $NATS_CREDS)%s",
		what, purpose, refused, who, given)
}

// publishesAnnotation is the cobra annotation of a verb that publishes
// events of one kind to the nodes it names (publishes sets it).
const publishesAnnotation = "meshfold.publishes"

// publishes marks cmd as a verb that publishes events of kind: a
// permission the server denies it is explained as the right to publish
// kind (explainDenied), whatever read before the publish was refused.
func publishes(cmd *cobra.Command, kind events.Kind) *cobra.Command {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[publishesAnnotation] = string(kind)
	return cmd
}

// publishesRolloutAnnotation is the cobra annotation of a verb that
// publishes a fleet's rollout event of one kind (apply: start; rollout
// promote, pause, …): publishesRollout sets it.
const publishesRolloutAnnotation = "meshfold.publishes-rollout"

// rolloutFleetAnnotation names the fleet of a rollout verb that takes it
// from a file (apply), once read.
const rolloutFleetAnnotation = "meshfold.rollout-fleet"

// publishesRollout marks cmd as a verb that publishes a fleet's rollout
// events of kind (an operator's: store/auth rolloutOperator): a
// permission the server denies it, its pre-reads included, is explained
// as the right to publish that, naming only the roles that may run the
// verb. apply with the controller's creds was refused a direct get of a
// node's agent event, and the error named operator-read, which may not
// start a rollout (a fresh user's finding F2).
func publishesRollout(cmd *cobra.Command, kind string) *cobra.Command {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[publishesRolloutAnnotation] = kind
	return cmd
}

// verbSubject returns the kind cmd publishes (publishes) and the subject
// of it for the first node cmd names (a "*" for a verb given --all), or
// the rollout kind and subject of a rollout verb's fleet (its first
// argument; FLEET for apply, whose fleet is in its file); "", "" for a
// command that publishes no event of a node or fleet.
func verbSubject(cmd *cobra.Command, prefix string) (events.Kind, string) {
	if cmd != nil && cmd.Annotations[publishesRolloutAnnotation] != "" {
		kind := cmd.Annotations[publishesRolloutAnnotation]
		fleet := cmp.Or(cmd.Annotations[rolloutFleetAnnotation], "FLEET")
		if args := cmd.Flags().Args(); len(args) > 0 && events.ValidName(args[0]) {
			fleet = args[0]
		}
		verb := cmd.Name()
		if cmd.Parent() != nil && cmd.Parent().Name() == "rollout" {
			verb = "rollout " + verb
		}
		return events.Kind(verb), events.Subjects{Prefix: prefix}.Rollout(fleet, kind)
	}
	if cmd == nil || cmd.Annotations[publishesAnnotation] == "" {
		return "", ""
	}
	kind := events.Kind(cmd.Annotations[publishesAnnotation])
	node := "*"
	if f := cmd.Flags().Lookup("all"); f != nil && f.Changed {
		// every node's: the first argument is no node
	} else if args := cmd.Flags().Args(); len(args) > 0 && events.ValidName(args[0]) {
		node = args[0]
	}
	return kind, events.Subjects{Prefix: prefix}.Event(node, kind)
}
