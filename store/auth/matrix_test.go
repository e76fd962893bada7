package auth_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/meshfold/meshfold/engine"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/waitfor"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/auth"
)

// policy is the whole permission policy, as a real server in operator mode
// enforces it on the credentials auth.Init and auth.AddNode issue: one row
// per action, one column per user. "ok": the action succeeded; "-": the
// server refused it with a permissions violation (a publish, a
// subscription or a JetStream API request the user's JWT does not allow).
//
// Actions: "publish K N" appends an event of kind K for node N through
// JetStream; "consume …" creates an ordered consumer (one filter subject,
// as node agents, provisioners and readers make them), reads its first
// message and asks the consumer's info (as a tail does after missed
// heartbeats): over N's plan, knock or settle, all of N's events, or the
// whole stream; "get K N" is the direct get of N's newest K that node agents and
// provisioners make on start; "leader get plan N" reads it from the
// stream's leader (store.LeaderReads: the message get, by stream, which
// only the roles that read the whole stream may send); "request fill" sends a fill request to
// ace's agent and reads its reply; "subscribe fill" listens on ace's fill
// subject (fill requests carry secrets); "read snapshots" opens the
// snapshot bucket, gets ace's state and lists every state (state, fleet);
// "get snapshot ace" finds the bucket and gets ace's state by key, as
// want --dry-run does when no reconciler answers;
// "write snapshots" puts ace's state; "write leases" opens (creating it
// the first time) the lease bucket of reconciler groups and puts a lease;
// "hold rollout lease web" claims and releases the rollout controller's
// lease of fleet web there; "publish rollout K" appends a fleet's rollout
// event of kind K;
// "watch node leases" watches the node agents' lease bucket, as the
// reconciler does to record agent liveness;
// "read effect key" opens the keys bucket (creating it the first time)
// and reads the key that signs effect message ids; "ask state" asks the reconciler's state service about ace; "ask fold"
// asks it for ace's whole folded state (want --dry-run); "request
// logs" asks ace's agent for a module's output and "serve logs" listens
// on that subject (`meshfold logs`, operator only); "push
// build", "list builds", "stat build" (want's check), "fetch build" and "remove build" act on the
// builds bucket as `meshfold build` and node agents do (the bundle
// fetched, and each one removed, were pushed by the operator first).
// "subscribe discovery" listens on $SRV.>, every micro service's
// discovery requests; "serve node discovery" and "serve state discovery"
// listen on the node agents' and the reconciler's service's own.
//
// "deliver [group] to S" creates a push consumer over a subject the user
// may consume (N's plan for node-N and the readers, ace's knock for
// provisioner-ace) whose deliver subject is service S's (ace's fill or
// logs endpoint, the state endpoint of node "victim"), with deliver group
// "q" (the services' queue group) or none, and counts whether a delivery
// reached the service's handler: "ok" it did, "-" it did not (the
// consumer was refused, or its deliveries were dropped at the service's
// door, store.CoreRequestsOnly). The server checks no deliver subject
// against its creator's permissions (nats-server v2.15), so no cell of
// these rows may be "ok". (A consumer without a deliver group reaches
// no queue group's member, and the state service's wildcard
// subscription takes no delivery on this server: those rows hold even
// without the door; the group rows to fill and logs did not.)
const policy = `
action               reconciler controller operator node-ace provisioner-ace node-shanks  operator-read
publish want ace          -         ok         -        -          -            -        -
publish want shanks       -         ok         -        -          -            -        -
publish approve ace       -         -          ok       -          -            -        -
publish approve shanks    -         -          ok       -          -            -        -
publish pause  ace        -         -          ok       -          -            -        -
publish resume ace        -         -          ok       -          -            -        -
publish poke   ace        -         -          ok       -          -            -        -
publish revoke ace        -         -          ok       -          -            -        -
publish waive  ace        -         -          ok       -          -            -        -
publish retire ace        -         -          ok       -          -            -        -
publish retire shanks     -         -          ok       -          -            -        -
publish ack    ace        -         -          ok       -          -            -        -
publish ack    shanks     -         -          ok       -          -            -        -
publish rollout start     -         -          ok       -          -            -        -
publish rollout nodes     -         -          ok       -          -            -        -
publish rollout promote   -         -          ok       -          -            -        -
publish rollout revert    -         -          ok       -          -            -        -
publish rollout published -         ok         -        -          -            -        -
publish rollout record    -         ok         -        -          -            -        -
publish rollout tick      -         ok         -        -          -            -        -
publish have ace          -         -          -        ok         -            -        -
publish have shanks       -         -          -        -          -            ok        -
publish settle ace        -         -          -        ok         -            -        -
publish settle shanks     -         -          -        -          -            ok        -
publish refusal ace       -         -          -        ok         -            -        -
publish refusal shanks    -         -          -        -          -            ok        -
publish filled ace        -         -          -        ok         -            -        -
publish filled shanks     -         -          -        -          -            ok        -
publish plan ace          ok        -          -        -          -            -        -
publish plan shanks       ok        -          -        -          -            -        -
publish knock ace         ok        -          -        -          -            -        -
publish knock shanks      ok        -          -        -          -            -        -
publish journal ace       ok        -          -        -          -            -        -
publish journal shanks    ok        -          -        -          -            -        -
publish agent ace         ok        -          -        -          -            -        -
publish agent shanks      ok        -          -        -          -            -        -
publish prov ace          ok        -          -        -          -            -        -
publish prov shanks       ok        -          -        -          -            -        -
consume plan ace          ok        ok         ok       ok         -            -       ok
consume plan shanks       ok        ok         ok       -          -            ok       ok
consume knock ace         ok        ok         ok       -          ok           -       ok
consume settle ace        ok        ok         ok       -          ok           -       ok
consume events ace        ok        ok         ok       -          -            -       ok
consume all               ok        ok         ok       -          -            -       ok
get plan ace              ok        ok         ok       ok         ok           -       ok
get plan shanks           ok        ok         ok       -          -            ok       ok
get knock ace             ok        -          ok       -          ok           -       ok
get settle ace            ok        -          ok       -          ok           -       ok
get agent ace             ok        -          ok       ok         -            -       ok
get agent shanks          ok        -          ok       -          -            ok      ok
leader get plan ace       ok        ok         ok       -          -            -       ok
request fill ace          -         -          -        -          ok           -        -
subscribe fill ace        -         -          -        ok         -            -        -
request logs ace          -         -          ok       -          -            -        -
serve logs ace            -         -          -        ok         -            -        -
read snapshots            ok        -          ok       -          -            -       ok
get snapshot ace          ok        ok         ok       -          -            -       ok
write snapshots           ok        -          -        -          -            -        -
write leases              ok        -          -        -          -            -        -
hold rollout lease web    ok        ok         -        -          -            -        -
read leases               ok        -          ok       -          -            -       ok
read effect key           ok        -          -        -          -            -        -
hold node lease ace       -         -          -        ok         -            -        -
hold node lease shanks    -         -          -        -          -            ok       -
hold prov lease ace       -         -          -        -          ok           -        -
hold prov lease shanks    -         -          -        -          -            -        -
get node lease ace        ok        -          ok       ok         -            -        -
watch node leases         ok        -          -        -          -            -        -
ask state ace             -         -          ok       -          -            -       ok
ask fold ace              -         ok         ok       -          -            -        -
push build                -         -          ok       -          -            -        -
list builds               -         ok         ok       -          -            -        -
stat build                -         ok         ok       ok         -            ok       ok
fetch build               -         -          ok       ok         -            ok       -
remove build              -         -          ok       -          -            -        -
put secret ace            -         -          ok       -          -            -        -
put secret shanks         -         -          ok       -          -            -        -
read secret ace           -         -          ok       -          ok           -        -
read secret shanks        -         -          ok       -          -            -        -
watch secrets ace         -         -          ok       -          ok           -        -
list secrets              -         -          ok       -          -            -        -
register key ace          -         -          ok       -          ok           -        -
register key shanks       -         -          ok       -          -            -        -
write fill status ace     -         -          -        -          ok           -        -
write fill status shanks  -         -          -        -          -            -        -
read fill status          -         -          ok       -          -            -       ok
read fill status ace      -         -          ok       -          ok           -       ok
subscribe discovery       -         -          -        -          -            -        -
serve node discovery      -         -          -        ok         -            ok       -
serve state discovery     ok        -          -        -          -            -        -
deliver to fill ace        -         -          -        -          -            -        -
deliver group to fill ace  -         -          -        -          -            -        -
deliver to logs ace        -         -          -        -          -            -        -
deliver group to logs ace  -         -          -        -          -            -        -
deliver to state victim    -         -          -        -          -            -        -
deliver group to state victim -      -          -        -          -            -        -
`

// row is one action of the policy with its expected cell per user.
type row struct {
	action string
	want   []string
}

func parsePolicy(t *testing.T) (users []string, rows []row) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(policy), "\n")
	users = strings.Fields(lines[0])[1:]
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) < len(users)+1 {
			t.Fatalf("policy line %q: %d cells, want %d", l, len(f)-1, len(users))
		}
		n := len(f) - len(users)
		rows = append(rows, row{action: strings.Join(f[:n], " "), want: f[n:]})
	}
	return users, rows
}

// cell is what an action runs with: a fresh connection of one user.
type cell struct {
	user string
	nc   *nats.Conn
	js   jetstream.JetStream
	cfg  store.StreamConfig
}

// witness is what the deliver actions observe: how many deliveries
// reached each of the fixture's services' handlers, and a barrier per
// service, a legitimate request whose reply means every message the
// service's subscription received before it was handled (an endpoint's
// handler runs once at a time, in order).
type witness struct {
	rjs     jetstream.JetStream // the reconciler's: consumer info and delete
	reached map[string]*atomic.Int64
	barrier map[string]func(context.Context) error
}

// errUnreached: a delivery was made and no service handled it.
var errUnreached = errors.New("no delivery reached the service")

// consumable is, per user, a subject the user may create consumers on.
func consumable(subj events.Subjects, user string) string {
	switch user {
	case "provisioner-ace":
		return subj.Stored("ace", events.KindKnock)
	case "node-shanks":
		return subj.Stored("shanks", events.KindPlan)
	}
	return subj.Stored("ace", events.KindPlan)
}

// deliver creates a push consumer over a subject the user may consume,
// delivering to the subject of service target (with deliver group "q"
// when group), waits for the server to deliver a message, then for the
// service's barrier, and reports whether a delivery reached the
// service's handler (nil) or not (errUnreached).
func deliver(w *witness, target, subject string, group bool) action {
	return func(ctx context.Context, c *cell) error {
		before := w.reached[target].Load()
		cc := jetstream.ConsumerConfig{FilterSubject: consumable(c.cfg.Subjects(), c.user), DeliverSubject: subject,
			AckPolicy: jetstream.AckExplicitPolicy}
		if group {
			cc.DeliverGroup = "q"
		}
		cons, err := c.js.CreatePushConsumer(ctx, c.cfg.Name, cc)
		if err != nil {
			return err
		}
		name := cons.CachedInfo().Name
		defer func() { _ = w.rjs.DeleteConsumer(context.WithoutCancel(ctx), c.cfg.Name, name) }()
		// Delivered, or no subscriber the server may deliver to (a queue
		// group's members take deliveries only from a consumer with
		// that deliver group): then nothing is sent.
		info, err := waitfor.Poll(ctx, "consumer "+name+" to deliver", func() (*jetstream.ConsumerInfo, bool) {
			rc, err := w.rjs.PushConsumer(ctx, c.cfg.Name, name)
			if err != nil {
				return nil, false
			}
			info := rc.CachedInfo()
			return info, info.Delivered.Consumer > 0 || !info.PushBound
		})
		if err != nil {
			return err
		}
		if info.Delivered.Consumer == 0 {
			return errUnreached
		}
		if err := w.barrier[target](ctx); err != nil {
			return fmt.Errorf("barrier request to %s: %w", target, err)
		}
		if w.reached[target].Load() > before {
			return nil
		}
		return errUnreached
	}
}

// action performs one action; nil means it succeeded.
type action func(ctx context.Context, c *cell) error

func actions(cfg store.StreamConfig, w *witness) map[string]action {
	subj := cfg.Subjects()
	acts := map[string]action{}
	for target, subject := range map[string]string{"fill ace": subj.Fill("ace"),
		"logs ace":     events.StateSubject(cfg.Prefix, events.EndpointLogs, "ace"),
		"state victim": events.StateSubject(cfg.Prefix, events.EndpointState, "victim")} {
		acts["deliver to "+target] = deliver(w, target, subject, false)
		acts["deliver group to "+target] = deliver(w, target, subject, true)
	}
	for _, k := range []string{"start", "nodes", "promote", "revert", "published", "record", "tick"} {
		acts["publish rollout "+k] = func(ctx context.Context, c *cell) error {
			_, err := c.js.Publish(ctx, subj.Rollout("web", k), []byte(`{"v":1}`))
			return err
		}
	}
	for _, node := range []string{"ace", "shanks"} {
		for _, k := range events.Kinds {
			acts["publish "+string(k)+" "+node] = func(ctx context.Context, c *cell) error {
				_, err := c.js.Publish(ctx, subj.Event(node, k), []byte(`{"v":1}`))
				return err
			}
		}
		acts["consume plan "+node] = consume(subj.Stored(node, events.KindPlan))
		for _, k := range []events.Kind{events.KindPlan, events.KindKnock, events.KindSettle, events.KindAgent} {
			acts["get "+string(k)+" "+node] = func(ctx context.Context, c *cell) error {
				stream, err := c.js.Stream(ctx, c.cfg.Name)
				if err != nil {
					return err
				}
				_, err = store.LastMsg(ctx, stream, subj, node, k)
				return err
			}
		}
	}
	acts["leader get plan ace"] = func(ctx context.Context, c *cell) error {
		_, err := store.LastMsg(ctx, store.Leader(c.js, c.cfg.Name), subj, "ace", events.KindPlan)
		return err
	}
	acts["consume knock ace"] = consume(subj.Stored("ace", events.KindKnock))
	acts["consume settle ace"] = consume(subj.Stored("ace", events.KindSettle))
	acts["consume events ace"] = consume(subj.StoredNode("ace"))
	acts["consume all"] = consume("")
	acts["request fill ace"] = func(ctx context.Context, c *cell) error {
		msg := nats.NewMsg(subj.Fill("ace"))
		msg.Header.Set(events.HeaderModule, "mesh-build-go")
		msg.Header.Set(events.HeaderPath, "/run/mesh-build-go/broker.creds")
		msg.Header.Set(events.HeaderWriter, "prov")
		msg.Data = []byte("secret")
		_, err := c.nc.RequestMsgWithContext(ctx, msg)
		return err
	}
	acts["subscribe fill ace"] = func(ctx context.Context, c *cell) error {
		_, err := c.nc.SubscribeSync(subj.Fill("ace"))
		return err
	}
	acts["read snapshots"] = func(ctx context.Context, c *cell) error {
		if _, err := c.js.KeyValue(ctx, c.cfg.Name+store.SnapshotBucketSuffix); err != nil {
			return err // what the read-only verbs check first
		}
		snaps, err := store.OpenSnapshots(ctx, c.js, c.cfg)
		if err != nil {
			return err
		}
		if _, _, err := snaps.GetNode(ctx, "ace"); err != nil {
			return err
		}
		return snaps.LoadAll(ctx, func(string, []byte) error { return nil })
	}
	acts["get snapshot ace"] = func(ctx context.Context, c *cell) error {
		snaps, err := store.FindSnapshots(ctx, c.js, c.cfg)
		if err != nil {
			return err
		}
		_, _, err = snaps.GetNode(ctx, "ace")
		return err
	}
	acts["write snapshots"] = func(ctx context.Context, c *cell) error {
		snaps, err := store.OpenSnapshots(ctx, c.js, c.cfg)
		if err != nil {
			return err
		}
		return snaps.PutNode(ctx, subj.Partition("ace"), "ace", []byte(`{}`))
	}
	acts["read effect key"] = func(ctx context.Context, c *cell) error {
		_, err := store.EffectKey(ctx, c.js, c.cfg, nil)
		return err
	}
	acts["write leases"] = func(ctx context.Context, c *cell) error {
		bucket := c.cfg.Name + "_LEASES"
		kv, err := c.js.KeyValue(ctx, bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			kv, err = c.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1,
				TTL: 5 * time.Second, LimitMarkerTTL: 5 * time.Second, Storage: jetstream.FileStorage})
		}
		if err != nil {
			return err
		}
		_, err = kv.Put(ctx, "lease.0", []byte("matrix"))
		return err
	}
	// A partition's lease, as the rollout views read who holds it
	// (query.Reader.Holders), in the bucket the reconciler made.
	acts["read leases"] = func(ctx context.Context, c *cell) error {
		kv, err := c.js.KeyValue(ctx, c.cfg.Name+"_LEASES")
		if err != nil {
			return err
		}
		_, err = kv.Get(ctx, "lease.0")
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil // read, and expired since
		}
		return err
	}
	// The rollout controller's lease of fleet web, in the bucket the
	// reconciler made ("write leases" comes first).
	acts["hold rollout lease web"] = func(ctx context.Context, c *cell) error {
		kv, err := c.js.KeyValue(ctx, c.cfg.Name+"_LEASES")
		if err != nil {
			return err
		}
		l, err := store.AcquireLease(ctx, kv, "rollout.web", store.NewHolder("rollout-controller", "web"), nil)
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}
	builds(acts, cfg)
	secretActions(acts)
	for _, node := range []string{"ace", "shanks"} {
		acts["hold node lease "+node] = func(ctx context.Context, c *cell) error {
			kv, err := c.js.KeyValue(ctx, c.cfg.Name+store.NodeLeaseBucketSuffix)
			if err != nil {
				return err
			}
			l, err := store.AcquireLease(ctx, kv, node, store.NewHolder("node", node), nil)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}
	}
	for _, node := range []string{"ace", "shanks"} {
		acts["hold prov lease "+node] = func(ctx context.Context, c *cell) error {
			kv, err := c.js.KeyValue(ctx, c.cfg.Name+store.NodeLeaseBucketSuffix)
			if err != nil {
				return err
			}
			l, err := store.AcquireLease(ctx, kv, store.ProvisionerLeaseKey(node), store.NewHolder("provisioner", node), nil)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}
	}
	acts["get node lease ace"] = func(ctx context.Context, c *cell) error {
		kv, err := c.js.KeyValue(ctx, c.cfg.Name+store.NodeLeaseBucketSuffix)
		if err != nil {
			return err
		}
		if _, err := kv.Get(ctx, "ace"); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return err
		}
		return nil // answered: held or not
	}
	acts["watch node leases"] = func(ctx context.Context, c *cell) error {
		kv, err := c.js.KeyValue(ctx, c.cfg.Name+store.NodeLeaseBucketSuffix)
		if err != nil {
			return err
		}
		w, err := kv.WatchAll(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = w.Stop() }()
		select { // the end of the initial values: the watch's consumer was made
		case <-w.Updates():
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// Discovery: every service's requests ($SRV.>, a fresh user's
	// finding m4), the node agent's own service's, the reconciler's.
	for act, subject := range map[string]string{"subscribe discovery": "$SRV.>",
		"serve node discovery": "$SRV.INFO.meshfold-node", "serve state discovery": "$SRV.INFO." + events.StateServiceName} {
		acts[act] = func(ctx context.Context, c *cell) error {
			_, err := c.nc.SubscribeSync(subject)
			return err
		}
	}
	acts["request logs ace"] = func(ctx context.Context, c *cell) error {
		_, err := c.nc.RequestWithContext(ctx, events.StateSubject(c.cfg.Prefix, events.EndpointLogs, "ace"), []byte(`{"module":"alpha"}`))
		return err
	}
	acts["serve logs ace"] = func(ctx context.Context, c *cell) error {
		_, err := c.nc.SubscribeSync(events.StateSubject(c.cfg.Prefix, events.EndpointLogs, "ace"))
		return err
	}
	acts["ask state ace"] = func(ctx context.Context, c *cell) error {
		_, _, err := query.RequestState(ctx, c.nc, c.cfg.Prefix, "ace", 0)
		return err
	}
	acts["ask fold ace"] = func(ctx context.Context, c *cell) error {
		_, err := query.RequestFold(ctx, c.nc, c.cfg.Prefix, "ace", 0)
		return err
	}
	return acts
}

// consume creates an ordered consumer with filter (none when empty),
// reads its first message and deletes it, as the roles' readers do.
func consume(filter string) action {
	return func(ctx context.Context, c *cell) error {
		occ := jetstream.OrderedConsumerConfig{InactiveThreshold: 30 * time.Second}
		if filter != "" {
			occ.FilterSubjects = []string{filter}
		}
		cons, err := c.js.OrderedConsumer(ctx, c.cfg.Name, occ)
		if err != nil {
			return err
		}
		it, err := cons.Messages()
		if err != nil {
			return err
		}
		_, err = it.Next(jetstream.NextContext(ctx))
		it.Stop()
		if err != nil {
			return err
		}
		// Its info, as a tail asks it after two missed heartbeats.
		if _, err := cons.Info(ctx); err != nil {
			return err
		}
		return c.js.DeleteConsumer(ctx, c.cfg.Name, cons.CachedInfo().Name)
	}
}

// fixture puts one event of every kind for ace and shanks in the stream,
// each published by the user the policy lets publish it, a snapshot of
// ace in the bucket, the state service, and a fill service for ace
// served by node-ace, as its agent serves it.
//
// Every service counts, in the returned witness, the messages its
// handler got that were no core request (JetStream deliveries), behind
// store.CoreRequestsOnly as meshfold's own services are; the state
// service is engine's own, counting lookups of node "victim".
func fixture(t *testing.T, s *secured) (store.StreamConfig, *witness) {
	t.Helper()
	ctx := testCtx(t)
	rnc, rjs := s.mustConnect(t, "reconciler")
	w := &witness{rjs: rjs, reached: map[string]*atomic.Int64{"fill ace": {}, "logs ace": {}, "state victim": {}},
		barrier: map[string]func(context.Context) error{}}
	count := func(target string, h micro.HandlerFunc) micro.Handler {
		return store.CoreRequestsOnly(micro.HandlerFunc(func(r micro.Request) {
			if !strings.HasPrefix(r.Reply(), "_INBOX") {
				w.reached[target].Add(1)
			}
			h(r)
		}), nil)
	}
	_, cfg, err := store.EnsureStream(ctx, rjs, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := store.OpenSnapshots(ctx, rjs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.OpenNodeLeases(ctx, rjs, cfg); err != nil {
		t.Fatal(err) // the reconciler creates the node lease bucket (runReconciler)
	}
	if err := snaps.PutNode(ctx, events.Partition("ace", cfg.Partitions), "ace", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	svc, err := engine.AddStateService(rnc, func(node string) (*reconcile.State, bool) {
		if node == "victim" {
			w.reached["state victim"].Add(1)
		}
		return reconcile.NewState(node), true
	}, engine.StateServiceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })

	publisher := map[events.Kind]string{events.KindWant: "controller",
		events.KindPlan: "reconciler", events.KindKnock: "reconciler", events.KindJournal: "reconciler", events.KindAgent: "reconciler", events.KindProv: "reconciler"}
	for _, k := range events.OperatorKinds {
		publisher[k] = "operator"
	}
	conns := map[string]jetstream.JetStream{"reconciler": rjs}
	for _, node := range []string{"ace", "shanks"} {
		for _, k := range events.Kinds {
			user, ok := publisher[k]
			if !ok {
				user = auth.UserName(auth.RoleNode, node)
			}
			if conns[user] == nil {
				_, conns[user] = s.mustConnect(t, user)
			}
			if _, err := conns[user].Publish(ctx, cfg.Subjects().Event(node, k), []byte(`{"v":1}`)); err != nil {
				t.Fatalf("%s publishing %s of %s: %v", user, k, node, err)
			}
		}
	}

	nnc, _ := s.mustConnect(t, "node-ace")
	fill, err := micro.AddService(nnc, micro.Config{Name: "meshfold-node", Version: "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fill.Stop() })
	err = fill.AddEndpoint("fill", count("fill ace", func(r micro.Request) { _ = r.RespondJSON(events.FillReply{OK: true}) }),
		micro.WithEndpointSubject(cfg.Subjects().Fill("ace")))
	if err != nil {
		t.Fatal(err)
	}
	err = fill.AddEndpoint("logs", count("logs ace", func(r micro.Request) { _ = r.RespondJSON(map[string]any{"lines": []string{}}) }),
		micro.WithEndpointSubject(events.StateSubject(cfg.Prefix, events.EndpointLogs, "ace")))
	if err != nil {
		t.Fatal(err)
	}
	for _, nc := range []*nats.Conn{rnc, nnc} {
		if err := nc.FlushWithContext(ctx); err != nil {
			t.Fatal(err)
		}
		if err := nc.LastError(); err != nil {
			t.Fatalf("serving the state and fill services: %v", err)
		}
	}
	setupBuilds(t, s)
	setupSecrets(t, s, cfg)

	// The barriers: the requests each service's legitimate user sends.
	pnc, _ := s.mustConnect(t, "provisioner-ace")
	onc, _ := s.mustConnect(t, "operator")
	w.barrier["fill ace"] = func(ctx context.Context) error {
		msg := nats.NewMsg(cfg.Subjects().Fill("ace"))
		msg.Header.Set(events.HeaderModule, "barrier")
		_, err := pnc.RequestMsgWithContext(ctx, msg)
		return err
	}
	w.barrier["logs ace"] = func(ctx context.Context) error {
		_, err := onc.RequestWithContext(ctx, events.StateSubject(cfg.Prefix, events.EndpointLogs, "ace"), []byte(`{"module":"alpha"}`))
		return err
	}
	w.barrier["state victim"] = func(ctx context.Context) error {
		_, err := onc.RequestWithContext(ctx, events.StateSubject(cfg.Prefix, events.EndpointState, "ace"), nil)
		return err
	}
	return cfg, w
}

// actionTimeout bounds one action, allowed or refused. A refused action
// ends as soon as the server reports the permissions violation (a
// refused JetStream call is otherwise just a request nobody answers), so
// the bound is only reached by a refusal that never comes. It used to be
// 300 ms for a refusal, which under load could pass before the action had
// sent its request at all: no violation then came, and the cell read ERR.
const actionTimeout = 5 * time.Second

// run performs act as user on a fresh connection and returns "ok", "-"
// (a permissions violation), or the error.
func run(s *secured, cfg store.StreamConfig, user string, act action) (string, error) {
	refused, cancel := context.WithCancel(context.Background())
	defer cancel()
	var nc *nats.Conn
	var err error
	// The connection is the cell's precondition, not its answer: one
	// whose handshake a starved server did not finish in the connect's
	// 5 s (637 connects; once in a race run at load ~45) is made again.
	for attempt := 1; ; attempt++ {
		nc, err = s.connect(user, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				cancel() // refused: do not wait for a reply that will not come
			}
		}))
		if err == nil || attempt == 3 || !handshakeTimedOut(err) {
			break
		}
	}
	if err != nil {
		return "", err
	}
	defer nc.Close()
	// The action's time starts once connected: under load a connection
	// can take long, and an action whose context ended before it sent
	// anything would see no refusal at all.
	ctx, cancelTimeout := context.WithTimeout(refused, actionTimeout)
	defer cancelTimeout()
	js, err := jetstream.New(nc)
	if err != nil {
		return "", err
	}
	err = act(ctx, &cell{user: user, nc: nc, js: js, cfg: cfg})
	// A violation arrives before the reply to a flush sent after it.
	fctx, fcancel := context.WithTimeout(context.Background(), actionTimeout)
	defer fcancel()
	ferr := nc.FlushWithContext(fctx)
	switch {
	case errors.Is(nc.LastError(), nats.ErrPermissionViolation), errors.Is(err, errUnreached) && ferr == nil:
		return "-", nil
	case err == nil && ferr == nil:
		return "ok", nil
	case err == nil:
		return "", ferr
	}
	return "", err
}

// handshakeTimedOut reports whether a connect failed for time alone: its
// handshake's read or write timed out, or the server's PING came before
// the PONG the client waited for.
func handshakeTimedOut(err error) bool {
	var ne net.Error
	return (errors.As(err, &ne) && ne.Timeout()) || errors.Is(err, nats.ErrTimeout) ||
		strings.Contains(err.Error(), "expected 'PONG', got 'PING'")
}

// The permission matrix: every user against every action of policy, on a
// real server in operator mode.
func TestPermissionMatrix(t *testing.T) {
	s := startSecured(t)
	cfg, w := fixture(t, s)
	users, rows := parsePolicy(t)
	acts := actions(cfg, w)
	start := time.Now()
	denied, failed := 0, false
	got := make([][]string, len(rows))
	for i, r := range rows {
		act := acts[r.action]
		if act == nil {
			t.Fatalf("policy action %q is not defined", r.action)
		}
		got[i] = make([]string, len(users))
		for j, user := range users {
			res, err := run(s, cfg, user, act)
			if err != nil {
				res = "ERR"
				t.Errorf("%s: %s: %v", user, r.action, err)
			}
			got[i][j] = res
			if res != r.want[j] {
				failed = true
				t.Errorf("%s: %s: %s, want %s", user, r.action, res, r.want[j])
			}
			if res == "-" {
				denied++
			}
		}
	}
	t.Logf("permission matrix: %d users × %d actions = %d cells, %d denied, in %s",
		len(users), len(rows), len(users)*len(rows), denied, time.Since(start).Round(time.Millisecond))
	if failed {
		var b strings.Builder
		fmt.Fprintf(&b, "%-22s %s\n", "action", strings.Join(users, " "))
		for i, r := range rows {
			fmt.Fprintf(&b, "%-22s %s\n", r.action, strings.Join(got[i], " "))
		}
		t.Logf("the server enforced:\n%s", b.String())
	}
}
