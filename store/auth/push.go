package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
)

// ErrPushSkipped: the server answered that it has not loaded the account,
// so it did not apply the update. A server with a MEMORY resolver would
// then load the account from its preloaded configuration, without the
// update: give it the new resolver.conf (and reload it), or use a full
// resolver, which stores every pushed JWT.
var ErrPushSkipped = errors.New("auth: the server skipped the update: it has not loaded the account")

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

// UpdateSubject returns the subject a server takes account JWT updates
// on: $SYS.REQ.ACCOUNT.<account>.CLAIMS.UPDATE (every resolver type
// subscribes to it).
func UpdateSubject(account string) string { return "$SYS.REQ.ACCOUNT." + account + ".CLAIMS.UPDATE" }

// Push sends the current JWT of the mesh account to the servers nc is
// connected to, and returns what the answering server said. nc must be a
// connection of a system-account user (the creds of "sys"). The server
// applies it at once: a revoked user's connections are closed and it can
// no longer connect. In a cluster one server answers; servers with a full
// resolver share the update, servers with a MEMORY resolver each apply it
// to their loaded account.
//
// Errors: [ErrPushSkipped]; the server's refusal (a JWT not signed by its
// operator, say); no answer before ctx is done (nats.ErrNoResponders when
// nc is not a system-account user).
func (d *Dir) Push(ctx context.Context, nc *nats.Conn) (string, error) {
	return d.pushAccount(ctx, nc, MeshAccountName, d.m.Account)
}

func (d *Dir) pushAccount(ctx context.Context, nc *nats.Conn, name, pub string) (string, error) {
	s, err := d.AccountJWT(name)
	if err != nil {
		return "", err
	}
	msg, err := nc.RequestWithContext(ctx, UpdateSubject(pub), []byte(s))
	if err != nil {
		return "", fmt.Errorf("push account %s: %w", name, err)
	}
	var r claimUpdateReply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return "", fmt.Errorf("push account %s: reply %q: %w", name, msg.Data, err)
	}
	switch {
	case r.Error != nil:
		return "", fmt.Errorf("push account %s: server %s: %s", name, r.Server.Name, r.Error.Description)
	case r.Data == nil:
		return "", fmt.Errorf("push account %s: reply %q: no status", name, msg.Data)
	case strings.Contains(r.Data.Message, "skipped"):
		return "", fmt.Errorf("push account %s: server %s: %w", name, r.Server.Name, ErrPushSkipped)
	}
	return r.Server.Name + ": " + name + " " + r.Data.Message, nil
}
