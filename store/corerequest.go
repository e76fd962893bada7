package store

import (
	"strings"

	"github.com/nats-io/nats.go/micro"
)

// IsCoreRequest reports whether a message with reply subject reply is a
// request a service may answer: it has a reply subject, and not one of
// JetStream's. A push consumer's deliveries carry the server's ack
// subject ($JS.ACK.…) or flow-control subject ($JS.FC.…) as their reply,
// or none (heartbeats), whatever the consumer's creator asked: a
// consumer can be created with any deliver subject and group (the
// server checks neither against its creator's permissions, nats-server
// v2.15; docs/architecture.md, "Deliver subjects"), so a service
// subject is reachable by deliveries from any role that may create a
// consumer, and only the reply tells them apart.
func IsCoreRequest(reply string) bool {
	return reply != "" && !strings.HasPrefix(reply, "$JS.")
}

// CoreRequestsOnly wraps h so that it serves only core NATS requests
// ([IsCoreRequest]): any other message (a JetStream delivery steered onto
// the service's subject) is dropped unanswered, and dropped, when not
// nil, is called with it. Every meshfold service endpoint (fill, logs,
// state) is wrapped.
func CoreRequestsOnly(h micro.Handler, dropped func(micro.Request)) micro.Handler {
	return micro.HandlerFunc(func(req micro.Request) {
		if !IsCoreRequest(req.Reply()) {
			if dropped != nil {
				dropped(req)
			}
			return
		}
		h.Handle(req)
	})
}
