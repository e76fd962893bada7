package main

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

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

// watchDenied makes a permission violation on nc end the command at once
// (a JetStream request denied is otherwise waited out until its timeout)
// and keeps the first for run to explain. It chains nc's error and closed
// handlers, but not for a violation: run explains it once, so the raw
// "nats async error" and "nats connection closed" log lines of it would
// only say it again.
func (a *app) watchDenied(nc *nats.Conn) {
	prev := nc.ErrorHandler()
	nc.SetErrorHandler(func(c *nats.Conn, s *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
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
		if errors.Is(c.LastError(), nats.ErrPermissionViolation) && a.deniedErr() != nil {
			return
		}
		if prevClosed != nil {
			prevClosed(c)
		}
	})
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
	roles := auth.AllowedRoles(m[2], m[1] == "Subscription", auth.Names{Stream: a.stream.name, Prefix: a.stream.prefix})
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
	return fmt.Errorf("%s (%s): permission denied: these credentials may not %s %s; %s: connect with such a user's creds (--creds, $NATS_CREDS)",
		what, purpose, op, m[2], who)
}
