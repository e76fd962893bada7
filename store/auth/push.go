package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
)

// ErrPushSkipped: the server answered that it has not loaded the account,
// so it did not apply the update. A server with a MEMORY resolver would
// then load the account from its preloaded configuration, without the
// update: give it the new resolver.conf (and reload it), or use a full
// resolver, which stores every pushed JWT.
var ErrPushSkipped = errors.New("auth: the server skipped the update: it has not loaded the account")

// ErrNoAnswer: a server the cluster knows did not answer the update
// before the push's context was done: it is down or cut off, and has not
// applied it. A full resolver fetches the update from the others one
// resolver interval (10s) after it starts; until then it accepts the
// revoked user, unless the new resolver.conf is copied to it first.
var ErrNoAnswer = errors.New("auth: no answer")

// claimUpdateReply is the server's reply on
// $SYS.REQ.ACCOUNT.<account>.CLAIMS.UPDATE (server.ServerAPIClaimUpdateResponse).
type claimUpdateReply struct {
	Server struct {
		Name string `json:"name"`
	} `json:"server"`
	Data *struct {
		Account string `json:"account"`
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"data"`
	Error *struct {
		Account     string `json:"account"`
		Code        int    `json:"code"`
		Description string `json:"description"`
	} `json:"error"`
}

// jszReply is a server's reply on $SYS.REQ.SERVER.PING.JSZ
// (server.ServerAPIResponse with a server.JSInfo): its name and, in a
// JetStream cluster, the meta group's leader and (on the leader) its
// other peers, offline ones included.
type jszReply struct {
	Server struct {
		Name string `json:"name"`
	} `json:"server"`
	Data struct {
		Meta *struct {
			Leader   string `json:"leader"`
			Size     int    `json:"cluster_size"`
			Replicas []struct {
				Name    string `json:"name"`
				Offline bool   `json:"offline"`
			} `json:"replicas"`
		} `json:"meta_cluster"`
	} `json:"data"`
}

// pingSubject is the subject every server answers with its JetStream
// report (server.JSInfo), JetStream enabled or not.
const pingSubject = "$SYS.REQ.SERVER.PING.JSZ"

// UpdateSubject returns the subject a server takes account JWT updates
// on: $SYS.REQ.ACCOUNT.<account>.CLAIMS.UPDATE (every resolver type
// subscribes to it).
func UpdateSubject(account string) string { return "$SYS.REQ.ACCOUNT." + account + ".CLAIMS.UPDATE" }

// PushAnswer is what one server did with a pushed account JWT.
type PushAnswer struct {
	Server string // the server's name (server_name)
	// Message is the server's word when it applied the update ("jwt
	// updated"); empty otherwise.
	Message string
	// Err is nil when the server applied the update; else
	// [ErrNoAnswer], [ErrPushSkipped], or the server's refusal.
	Err error
}

// PushReport is what every known server did with a pushed account JWT.
type PushReport struct {
	Account string       // the account's name in the directory: "mesh"
	Servers []PushAnswer // one per known server, by name
	// Unnamed counts the servers of the JetStream meta group (its
	// cluster_size as an answering server knows it) that did not answer
	// and that no answer named: there was no meta leader to list them.
	Unnamed int
}

// Applied reports whether every known server applied the update.
func (r PushReport) Applied() bool {
	if r.Unnamed > 0 {
		return false
	}
	for _, a := range r.Servers {
		if a.Err != nil {
			return false
		}
	}
	return true
}

// Push sends the current JWT of the mesh account to every server of the
// cluster nc is connected to and reports each one's answer. nc must be a
// connection of a system-account user (the creds of "sys"). Each server
// applies it at once: a revoked user's connections are closed and it can
// no longer connect.
//
// Every server answers the update on its own (each resolver type
// subscribes to the update subject). The servers expected are those that
// answer a ping ($SYS.REQ.SERVER.PING.JSZ) and, in a JetStream cluster,
// the meta leader's peers, offline ones included: one of these that does
// not answer the update before ctx is done is reported with
// [ErrNoAnswer]. Push returns as soon as every expected server answered
// when it knows them all (a server outside a cluster; a JetStream
// cluster once its meta leader answered the ping); otherwise it collects
// answers until ctx is done, so give ctx a deadline (seconds). Servers
// of a JetStream cluster without a meta leader that did not answer are
// only counted ([PushReport.Unnamed]); a server that is down in a
// cluster without JetStream is missing from the report.
//
// Errors: an unreadable JWT file; no server answered before ctx was done
// ([ErrNoAnswer]); nats.ErrNoResponders when nc is not a system-account
// user. A refusal by some server is in the report, not an error.
func (d *Dir) Push(ctx context.Context, nc *nats.Conn) (PushReport, error) {
	return d.pushAccount(ctx, nc, MeshAccountName, d.m.Account)
}

func (d *Dir) pushAccount(ctx context.Context, nc *nats.Conn, name, pub string) (PushReport, error) {
	rep := PushReport{Account: name}
	s, err := d.AccountJWT(name)
	if err != nil {
		return rep, err
	}
	fail := func(err error) (PushReport, error) { return rep, fmt.Errorf("push account %s: %w", name, err) }

	answers, pings := make(chan *nats.Msg, 64), make(chan *nats.Msg, 64)
	updInbox, pingInbox := nc.NewRespInbox(), nc.NewRespInbox()
	for inbox, ch := range map[string]chan *nats.Msg{updInbox: answers, pingInbox: pings} {
		sub, err := nc.ChanSubscribe(inbox, ch)
		if err != nil {
			return fail(err)
		}
		defer sub.Unsubscribe() //nolint:errcheck // the connection's end drops it too
	}
	// Ping first: a server's answer to the ping then never trails its
	// answer to the update by much.
	if err := nc.PublishRequest(pingSubject, pingInbox, nil); err != nil {
		return fail(err)
	}
	if err := nc.PublishRequest(UpdateSubject(pub), updInbox, []byte(s)); err != nil {
		return fail(err)
	}

	got := map[string]PushAnswer{}
	known := map[string]bool{}
	// A server outside a cluster is the only one: its answer is all.
	allKnown := nc.ConnectedClusterName() == ""
	size := 0 // the meta group's size, as the answering servers know it
	for !(allKnown && len(got) > 0 && len(got) >= len(known)) {
		select {
		case m := <-answers:
			if isNoResponders(m) {
				return fail(nats.ErrNoResponders)
			}
			a, err := parseAnswer(m.Data)
			if err != nil {
				return fail(err)
			}
			got[a.Server], known[a.Server] = a, true
		case m := <-pings:
			if isNoResponders(m) {
				continue
			}
			var r jszReply
			if json.Unmarshal(m.Data, &r) != nil || r.Server.Name == "" {
				continue // a ping answer only widens the expected set
			}
			known[r.Server.Name] = true
			if meta := r.Data.Meta; meta != nil {
				size = max(size, meta.Size)
			}
			if meta := r.Data.Meta; meta != nil && meta.Leader == r.Server.Name {
				for _, p := range meta.Replicas {
					if p.Name != "" { // a peer the leader has not heard from yet
						known[p.Name] = true
					}
				}
				allKnown = true
			}
		case <-ctx.Done():
			if len(got) == 0 {
				return fail(fmt.Errorf("%w before %w", ErrNoAnswer, context.Cause(ctx)))
			}
			allKnown = true
			for n := range known {
				if _, ok := got[n]; !ok {
					got[n] = PushAnswer{Server: n, Err: ErrNoAnswer}
				}
			}
		}
	}
	for _, n := range slices.Sorted(maps.Keys(got)) {
		rep.Servers = append(rep.Servers, got[n])
	}
	rep.Unnamed = max(0, size-len(got))
	return rep, nil
}

// isNoResponders reports whether m is the server's "no responders"
// status (503): nobody subscribes to the subject, as for a user outside
// the system account.
func isNoResponders(m *nats.Msg) bool {
	return len(m.Data) == 0 && m.Header.Get("Status") == "503"
}

// parseAnswer reads one server's answer to an account update.
func parseAnswer(data []byte) (PushAnswer, error) {
	var r claimUpdateReply
	if err := json.Unmarshal(data, &r); err != nil {
		return PushAnswer{}, fmt.Errorf("reply %q: %w", data, err)
	}
	a := PushAnswer{Server: r.Server.Name}
	switch {
	case r.Error != nil:
		a.Err = errors.New(r.Error.Description)
	case r.Data == nil:
		return PushAnswer{}, fmt.Errorf("reply %q: no status", data)
	case strings.Contains(r.Data.Message, "skipped"):
		a.Err = ErrPushSkipped
	default:
		a.Message = r.Data.Message
	}
	return a, nil
}
