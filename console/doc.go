// Package console is meshfold's read-only web console (DESIGN.md §6,
// `meshfold console` and `meshfold serve --http`): a fleet page that
// lists what needs an operator first and then every node, with live
// updates as events fold; and a page per node with its history as a
// picture (one lane per event kind, plans, knocks and held rows marked),
// the explanation of any event, and its state now or as of any sequence
// or time.
//
// It decides nothing. Every row, summary, chain and state it shows is
// computed by reconcile/audit, the code `meshfold fleet`, `state` and
// `audit` print from: [audit.FleetRowOfView] and [audit.SortFleet] for
// the fleet, [audit.History.Timeline], [audit.History.Why] and
// [audit.History.AsOf] for a node, [audit.StateText] for its state. This
// package lays those out as HTML and SVG (Go's html/template, assets
// embedded) and carries the fleet's changes to the browser as
// server-sent events, swapped in by a dozen lines of JavaScript; no other
// script, no build step.
//
// It reads through a [Source]: a *query.Reader, the read side every
// reader of a deployment uses, reads the stream, the snapshot bucket and
// the reconciler's state service, and needs no more than the
// operator-read role of store/auth. Every route is a GET: the
// console publishes nothing. Nothing it shows holds filled-file content:
// the stream never carries it (DESIGN.md §5.5), and a filled event's
// digest is left out of every summary. It listens on loopback unless
// told otherwise ([DefaultListen]).
package console
