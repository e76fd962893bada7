package console

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/reconcile/audit"
)

// The picture's geometry, in SVG user units (pixels at 100 %).
const (
	svgWidth    = 1160
	laneLabelW  = 86
	svgRight    = 16
	laneHeight  = 26
	svgTop      = 8
	axisHeight  = 28
	plotWidth   = svgWidth - laneLabelW - svgRight
	laneHeldKey = "held"
)

// picture is the timeline of a window of events as an SVG: one lane per
// event kind (and one for held rows), one mark per event, each a link to
// its explanation.
type picture struct {
	Width, Height int
	PlotLeft      int
	PlotRight     int
	AxisY         int
	Lanes         []lane
	Marks         []mark
	Spans         []span
	Ticks         []tick
	// Bound is the x of the as-of bound's line, when one is drawn.
	Bound     *float64
	BoundText string
}

type lane struct {
	Key   string
	Y     int // the lane's centre line
	Top   int
	Label string
}

// mark is one event.
type mark struct {
	Seq     uint64
	Kind    string
	Shape   string // "dot", "plan", "knock", "error"
	X, Y    float64
	R       float64
	Label   string // drawn beside plans and knocks when the window is small
	Title   string // the tooltip: the timeline's line
	Href    string
	Chosen  bool
	HasHeld bool
	// Tone is what the event says, for its colour: a have's worst module
	// ("failed", "unhealthy", "starting", "ok", "empty"), an agent's
	// "down" or "up", a want a rollout step published ("rollout",
	// "rollout-revert"); empty for other kinds.
	Tone string
}

// span is a plan's held rows, from the plan to the next plan.
type span struct {
	Seq      uint64
	X, W     float64
	Y        int
	Label    string
	Title    string
	Href     string
	Approval bool
}

type tick struct {
	X     float64
	Label string
}

// laneKinds are the lanes, in the order of events.Kinds; an event of a
// kind this build does not know goes to the last lane, "other".
func laneKinds() []string {
	out := make([]string, 0, len(events.Kinds)+2)
	for _, k := range events.Kinds {
		out = append(out, string(k))
		if k == events.KindPlan {
			out = append(out, laneHeldKey)
		}
	}
	return append(out, "other")
}

// draw lays out entries (the window [from, to) of h's events) as a
// picture. byTime spaces events by stream time instead of by order;
// chosen is the event explained (0: none); href makes an event's link;
// bound, when set, is the as-of bound drawn as a line after the last
// event it includes.
func draw(h *audit.History, from, to int, byTime bool, chosen uint64, href func(seq uint64) string, bound string) picture {
	evs := h.Events[from:to]
	// The lanes: the kinds every history has, and any other kind the
	// window holds (approvals, journal entries, operator events).
	present := map[string]bool{"want": true, "have": true, "settle": true, "refusal": true,
		"filled": true, "plan": true, laneHeldKey: true, "knock": true}
	for _, ev := range evs {
		if ev.Kind.Known() {
			present[string(ev.Kind)] = true
		} else {
			present["other"] = true
		}
	}
	var kinds []string
	for _, k := range laneKinds() {
		if present[k] {
			kinds = append(kinds, k)
		}
	}
	p := picture{Width: svgWidth, PlotLeft: laneLabelW, PlotRight: svgWidth - svgRight}
	laneOf := map[string]lane{}
	for i, k := range kinds {
		l := lane{Key: k, Top: svgTop + i*laneHeight, Label: k}
		l.Y = l.Top + laneHeight/2
		p.Lanes = append(p.Lanes, l)
		laneOf[k] = l
	}
	p.AxisY = svgTop + len(kinds)*laneHeight
	p.Height = p.AxisY + axisHeight
	n := len(evs)
	if n == 0 {
		return p
	}
	step := float64(plotWidth) / float64(n)
	t0, t1 := evs[0].Time, evs[n-1].Time
	for _, ev := range evs {
		t0, t1 = minTime(t0, ev.Time), maxTime(t1, ev.Time)
	}
	x := func(i int) float64 {
		if byTime {
			span := t1.Sub(t0)
			if span <= 0 {
				return float64(laneLabelW) + float64(plotWidth)/2
			}
			return float64(laneLabelW) + 6 + float64(plotWidth-12)*float64(evs[i].Time.Sub(t0))/float64(span)
		}
		return float64(laneLabelW) + (float64(i)+0.5)*step
	}
	r := min(5, max(1.5, step/2.5))
	labels := n <= 60
	entries := h.Timeline(from, to)
	var plans []int
	for i, ev := range evs {
		k := string(ev.Kind)
		if !ev.Kind.Known() {
			k = "other"
		}
		l := laneOf[k]
		m := mark{Seq: ev.Seq, Kind: k, Shape: "dot", X: x(i), Y: float64(l.Y), R: r,
			Title: entries[i].Line(audit.SeqWidth(entries[i : i+1])), Href: href(ev.Seq), Chosen: ev.Seq == chosen}
		switch {
		case ev.Err != nil:
			m.Shape = "error"
		case ev.Kind == events.KindPlan:
			m.Shape, m.R = "plan", max(r, 3.5)
			plans = append(plans, i)
			if p, ok := ev.Payload.(*events.Plan); ok {
				m.HasHeld = slices.ContainsFunc(p.Modules, func(r events.PlanModule) bool { return r.Held })
			}
		case ev.Kind == events.KindKnock:
			m.Shape, m.R = "knock", max(r, 4)
		case ev.Kind == events.KindAgent:
			// The agent's down and up moments: a line across every lane.
			m.Shape, m.R = "agent", max(r, 4)
			if a, ok := ev.Payload.(*events.Agent); ok {
				m.Tone = string(a.State)
			}
		case ev.Kind == events.KindHave:
			if h, ok := ev.Payload.(*events.Have); ok {
				m.Tone = haveTone(h)
			}
		case entries[i].Rollout != nil:
			// A want a rollout step published: marked, its title says
			// which rollout, batch and why (DESIGN.md §11).
			m.Tone = "rollout"
			if entries[i].Rollout.Step == "revert" {
				m.Tone = "rollout-revert"
			}
			m.Title += "\n" + entries[i].Rollout.Text()
		}
		if labels && (m.Shape == "plan" || m.Shape == "knock") {
			m.Label = "#" + strconv.FormatUint(ev.Seq, 10)
		}
		p.Marks = append(p.Marks, m)
	}
	// Held rows: each plan's, from it to the next plan of the window (or
	// the end of the picture).
	hl := laneOf[laneHeldKey]
	for j, i := range plans {
		pl, ok := evs[i].Payload.(*events.Plan)
		if !ok {
			continue
		}
		var held []string
		approval := false
		for _, row := range pl.Modules {
			if !row.Held {
				continue
			}
			s := row.Name + " (" + string(row.Why)
			if row.Pending != "" {
				s += ", pending " + row.Pending
			}
			held = append(held, s+")")
			approval = approval || row.Why == events.HoldApproval
		}
		if len(held) == 0 {
			continue
		}
		x0, x1 := x(i), float64(p.PlotRight)
		if j+1 < len(plans) {
			x1 = x(plans[j+1])
		}
		text := strings.Join(held, ", ")
		s := span{Seq: evs[i].Seq, X: x0, W: max(2, x1-x0), Y: hl.Top + 5, Title: fmt.Sprintf("plan #%d holds %s", evs[i].Seq, text),
			Href: href(evs[i].Seq), Approval: approval}
		if w := int((x1 - x0) / 6.2); w >= 8 {
			s.Label = audit.Clip(text, w)
		}
		p.Spans = append(p.Spans, s)
	}
	// Ticks: about eight, at events (by order) or at even times.
	const nticks = 8
	for k := range nticks {
		i := k * (n - 1) / max(1, nticks-1)
		if k > 0 && i == (k-1)*(n-1)/max(1, nticks-1) {
			continue
		}
		label := "#" + strconv.FormatUint(evs[i].Seq, 10)
		if byTime {
			label = evs[i].Time.UTC().Format("15:04:05")
		}
		p.Ticks = append(p.Ticks, tick{X: x(i), Label: label})
	}
	if bound != "" {
		bx := min(float64(p.PlotRight), x(n-1)+min(step/2, 8))
		p.Bound, p.BoundText = &bx, "as of "+bound
	}
	return p
}

// haveTone is what a have says at a glance, its worst module first:
// "failed" (exited, waiting to restart), "unhealthy", "starting" (alive,
// no passing check yet), "ok" (everything runs), "empty" (nothing runs).
func haveTone(h *events.Have) string {
	tone, worst := "empty", 0
	for _, m := range h.Modules {
		t, w := "ok", 1
		switch {
		case m.State == events.Failed:
			t, w = "failed", 4
		case m.Health == events.Unhealthy:
			t, w = "unhealthy", 3
		case m.State == events.Running && m.Health == events.HealthStarting:
			t, w = "starting", 2
		}
		if w > worst {
			tone, worst = t, w
		}
	}
	return tone
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
