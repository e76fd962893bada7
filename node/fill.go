package node

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/internal/tracing"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/store"
)

// ServiceName is the name of the agent's NATS micro service; its one
// endpoint, "fill", listens on mesh.<node>.fill.
const ServiceName = "meshfold-node"

// serviceVersion is the micro service's version (semver, required).
const serviceVersion = "1.0.0"

// dropped logs a message a service endpoint did not answer: a JetStream
// delivery steered onto its subject by another role's consumer.
func (a *Agent) dropped(req micro.Request) {
	a.log.Warn("service: dropped a message that is no core request (a JetStream delivery?)", "subject", req.Subject(), "reply", req.Reply())
}

// serve registers the fill endpoint as a micro service.
func (a *Agent) serve(ctx context.Context) (micro.Service, error) {
	subject := a.subj.Fill(a.cfg.Name)
	svc, err := micro.AddService(a.nc, micro.Config{
		Name:        ServiceName,
		Version:     serviceVersion,
		Description: "meshfold node agent: filled-file writes for node " + a.cfg.Name,
		Metadata:    map[string]string{"node": a.cfg.Name},
		ErrorHandler: func(_ micro.Service, e *micro.NATSError) {
			a.log.Error("fill service error", "subject", e.Subject, "err", e.Description)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("node agent: fill service: %w", err)
	}
	if err := svc.AddEndpoint("fill", store.CoreRequestsOnly(micro.HandlerFunc(func(req micro.Request) { a.serveFill(ctx, req) }), a.dropped),
		micro.WithEndpointSubject(subject)); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("node agent: fill endpoint on %s: %w", subject, err)
	}
	if err := a.addLogs(ctx, svc); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("node agent: logs endpoint: %w", err)
	}
	return svc, nil
}

// serveFill answers one fill request.
func (a *Agent) serveFill(ctx context.Context, req micro.Request) {
	r := events.FillRequestOf(req.Headers())
	if err := r.Validate(); err != nil {
		a.log.Warn("bad fill request", "err", err)
		reply := events.FillReply{Error: "bad fill request: " + err.Error()}
		data, _ := json.Marshal(reply)
		_ = req.Error("400", reply.Error, data)
		return
	}
	select {
	case <-a.ready:
	case <-ctx.Done():
		return // the agent stops: no reply, the client retries elsewhere or later
	}
	ctx, span := a.startSpan(ctx, nats.Header(req.Headers()), "fill", trace.SpanKindServer,
		tracing.Module.String(r.Module), tracing.Path.String(r.Path), tracing.Writer.String(r.Writer))
	reply := a.fill(ctx, r, req.Data())
	switch {
	case reply.Reason != "":
		span.SetAttributes(tracing.Reason.String(string(reply.Reason)))
	case !reply.OK:
		span.SetStatus(codes.Error, reply.Error)
	}
	span.End()
	if err := req.RespondJSON(reply); err != nil {
		a.log.Warn("fill reply not sent", "module", r.Module, "path", r.Path, "err", err)
	}
}

// fill judges one write against the settled plan, writes it when
// accepted, publishes filled or refusal and returns the reply. Judging and
// writing happen under the judging lock, so a plan switch never falls
// between them; the event is published after the lock is released, and
// the reply is sent once it is stored. A retry of the request that last
// wrote the file (the same events.HeaderRequest, not empty), finding its
// content in place, is answered OK as that write was, and appends no
// second filled.
func (a *Agent) fill(ctx context.Context, req events.FillRequest, content []byte) events.FillReply {
	module, path, writer, request := req.Module, req.Path, req.Writer, req.Request
	a.mu.Lock()
	if a.root == nil {
		a.mu.Unlock()
		return events.FillReply{Error: "node agent is stopping"}
	}
	plan, seq, claim := a.settled, a.settledSeq, a.claimed
	file, reason := reconcile.JudgePlan(plan, module, path, writer)
	ref := fileRef{module, path}
	sum := digest(a.key, content)
	var werr error
	unchanged, again := false, false
	if reason == "" {
		account := ""
		if row := plan.Module(module); row != nil {
			account = row.RunsAs
		}
		// A refill of what the file already holds (same keyed digest, mode
		// and owner) rewrites nothing and reports nothing, unless this
		// agent refused a write of it since it last wrote it (an item may
		// be owed that only a filled pays). When it is a retry of the
		// request that wrote it, the retry is told so (again).
		if !a.refused[ref] && sameFile(a.root, file, account, a.key, sum) {
			again = request != "" && a.wrote[ref] == request
			unchanged = !again
			a.heldFile(ref)
		} else if werr = writeFile(a.root, file, account, content); werr != nil {
			reason = events.ReasonWriteFailed
		} else {
			a.heldFile(ref)
			if a.wrote == nil {
				a.wrote = map[fileRef]string{}
			}
			a.wrote[ref] = request
		}
	}
	switch {
	case reason != "":
		if a.refused == nil {
			a.refused = map[fileRef]bool{}
		}
		a.refused[ref] = true
	case !unchanged:
		delete(a.refused, ref)
	}
	a.mu.Unlock()
	if unchanged {
		a.log.Debug("fill unchanged: not rewritten", "module", module, "path", path, "plan", seq)
		return events.FillReply{OK: true, Unchanged: true}
	}
	if again {
		a.log.Debug("fill retried after this request wrote it: not rewritten", "module", module, "path", path, "plan", seq)
		return events.FillReply{OK: true}
	}
	if reason == "" {
		// Wake the module before reporting: its start waits on this file.
		a.filledModule(ctx, module)
	}

	log := a.log.With("module", module, "path", path, "writer", writer, "plan", seq)
	if reason != "" {
		r := &events.Refusal{Module: module, Path: path, Reason: reason, Plan: seq, Writer: writer}
		reply := events.FillReply{Reason: reason}
		if werr != nil {
			r.Error, reply.Error = events.Cut(werr.Error(), events.MaxText), werr.Error()
			log.Warn("fill refused", "reason", reason, "err", werr)
		} else {
			log.Info("fill refused", "reason", reason)
		}
		id := RefusalID(a.key, a.cfg.Name, seq, module, path, writer)
		if reason == events.ReasonWriteFailed {
			// Each failed write is a new failure (DESIGN.md §4: a
			// write-failed after a filled at its plan is owed again), not
			// a repeat to drop within the dedup window.
			id += "." + nuid.Next()
		}
		if _, err := a.publish(ctx, events.Stamp(r, time.Now()), store.WithMsgID(id)); err != nil {
			reply.Error = joinMsg(reply.Error, "refusal not recorded: "+err.Error())
		}
		return reply
	}
	f := &events.Filled{Module: module, Path: path, Plan: seq, Digest: sum, Claim: claim}
	if _, err := a.publish(ctx, events.Stamp(f, time.Now()), store.WithMsgID(nuid.Next())); err != nil {
		// The file is written; only the report is missing.
		return events.FillReply{OK: true, Error: "filled not recorded: " + err.Error()}
	}
	log.Info("filled", "mode", file.Mode)
	return events.FillReply{OK: true}
}

func joinMsg(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
