package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/rollout"
	"github.com/meshfold/meshfold/rollout/feed"
)

// RolloutSource is what the rollouts pages read (query.Reader is one): a
// source without it shows no rollout.
type RolloutSource interface {
	// RolloutFleets returns the fleets the stream holds a rollout of.
	RolloutFleets(ctx context.Context) ([]string, error)
	// Rollout returns a fleet's newest rollout, refolded from its start.
	Rollout(ctx context.Context, fleet string) (*rollout.State, error)
}

// ControllerLeaseSource is what the rollouts page reads of a fleet's
// rollout controller lease (the reconcilers' lease bucket; query.Reader
// is one), to measure "no controller for" from the lease's expiry: a
// source without it, or one whose creds may not read the bucket,
// measures from the rollout's last record, as before.
type ControllerLeaseSource interface {
	// ControllerHolder returns who holds fleet's controller lease, and
	// the bucket's TTL (query.Reader.ControllerHolder).
	ControllerHolder(ctx context.Context, fleet string) (query.LeaseHolder, time.Duration, error)
}

var _ ControllerLeaseSource = (*query.Reader)(nil)

// RolloutGoneSource is what the rollouts page reads of the fleets whose
// newest rollout's start the stream's limits dropped (--max-age,
// --max-bytes shorter than the rollout), to list them as `rollout ls`
// does, "start gone" (query.Reader is one): a source without it lists
// none of them.
type RolloutGoneSource interface {
	// RolloutFleetsWithoutStart returns the fleets the stream holds
	// rollout events of but no start, sorted.
	RolloutFleetsWithoutStart(ctx context.Context) ([]string, error)
	// RolloutRemains returns what the stream holds of a fleet's newest
	// rollout whose start it dropped (feed.ReadRemains).
	RolloutRemains(ctx context.Context, fleet string) (feed.Remains, error)
}

// NoPlanSource is what the rollout page reads to say that a target's
// want has no plan because no live reconciler folds its partition
// (query.Reader is one): a source without it says nothing of it.
type NoPlanSource interface {
	// NoPlanYet adds the reason to the WHY of each such target of v
	// (query.Reader.NoPlanYet).
	NoPlanYet(ctx context.Context, v *rollout.View, now time.Time) (map[string]string, error)
}

// The pages are live through static/refresh.js: every two seconds it
// fetches the page again and swaps in its body, until the rollout is
// final.
type rolloutsPage struct {
	Views []rolloutRow
	Error string
	// Notes are the lines under the table: one per rollout whose start
	// is gone, in `rollout ls`'s words (feed.Remains.Note).
	Notes []string
	// Unattended are the lines under the table for the rollouts no
	// controller acts on, in `rollout ls`'s words.
	Unattended []string
}

// rolloutRow is one fleet's line of the list: its rollout's view, or,
// its start gone from the stream, its fleet and rollout and Gone.
type rolloutRow struct {
	rollout.View
	Done int
	Gone *feed.Remains
	// NoController is how long no rollout controller has acted on a
	// rollout that owes a step (rollout.State.Unattended), as `rollout
	// ls` says it ("1m22s"); empty otherwise.
	NoController string
}

type rolloutPage struct {
	Fleet   string
	View    rollout.View
	Batches [][]rollout.TargetView
	Error   string
	// Unattended says, as of the page's clock, that no controller acts
	// on the rollout (rollout.State.Unattended); empty otherwise.
	Unattended string
	// Counts are the targets of each status, most pressing first, each
	// a link to the page of those targets only; Filter is the status
	// the page shows (?status=), empty for every target.
	Counts []statusCount
	Filter rollout.Status
	// Shown counts the targets the batches hold (all of them, or the
	// filter's); Total says how many the rollout has ("300 targets").
	Shown int
	Total string
}

// statusCount is one status's count on the rollout page.
type statusCount struct {
	Status rollout.Status
	N      int
}

// rolloutsPage lists the fleets' newest rollouts (DESIGN.md §11).
func (c *Console) rolloutsPage(w http.ResponseWriter, r *http.Request) {
	var p rolloutsPage
	src, ok := c.cfg.Source.(RolloutSource)
	if !ok {
		c.render(w, "rollouts.html", p)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	fleets, err := src.RolloutFleets(ctx)
	if err != nil {
		p.Error = err.Error()
	}
	now := c.cfg.Now()
	goneSrc, _ := c.cfg.Source.(RolloutGoneSource)
	var gone []string
	if goneSrc != nil {
		if gone, err = goneSrc.RolloutFleetsWithoutStart(ctx); err != nil {
			p.Error = err.Error()
		}
	}
	for _, f := range fleets {
		s, err := src.Rollout(ctx, f)
		if errors.Is(err, feed.ErrNoRollout) && goneSrc != nil {
			gone = append(gone, f) // its start aged out since the list
			continue
		}
		if err != nil {
			p.Error = err.Error()
			continue
		}
		v := s.View()
		v.Targets = nil
		row := rolloutRow{View: v, Done: v.Counts[rollout.Done]}
		if u := s.Unattended(now); u != nil {
			// As `rollout ls` says it: the list said "running" where
			// ls said "running, no controller for 1m22s" (a fresh
			// user's finding M9). Measured from the controller lease's
			// expiry when the lease says when: the rollout's last record
			// of a quiet rollout came minutes before the controller died
			// ("no controller for 5m37s" 82 s after a kill -9, a fresh
			// user's finding M8).
			since := u.Since
			if ls, ok := c.cfg.Source.(ControllerLeaseSource); ok {
				if h, ttl, err := ls.ControllerHolder(ctx, f); err == nil && h.Held {
					if expiry := h.Renewed.Add(ttl); !expiry.After(now) {
						since = expiry
					}
				}
			}
			row.NoController = now.Sub(since).Round(time.Second).String()
			p.Unattended = append(p.Unattended, fmt.Sprintf("unattended: no rollout controller acts on fleet %s's rollout: its page says since when and what it owes", f))
		}
		p.Views = append(p.Views, row)
	}
	for _, f := range gone {
		g, err := goneSrc.RolloutRemains(ctx, f)
		if err != nil {
			p.Error = fmt.Sprintf("fleet %s's rollout events, its start gone: %v", f, err)
			continue
		}
		if !g.StartGone() {
			continue // what `rollout status` calls no rollout
		}
		p.Views = append(p.Views, rolloutRow{View: rollout.View{Fleet: f, Rollout: g.ID}, Gone: &g})
	}
	slices.SortFunc(p.Views, func(x, y rolloutRow) int { return strings.Compare(x.Fleet, y.Fleet) })
	for _, r := range p.Views {
		if r.Gone != nil {
			p.Notes = append(p.Notes, r.Gone.Note(r.Fleet))
		}
	}
	c.render(w, "rollouts.html", p)
}

// rolloutPage shows one fleet's newest rollout: its batches and targets,
// and its builds.
func (c *Console) rolloutPage(w http.ResponseWriter, r *http.Request) {
	fleet := r.PathValue("fleet")
	p := rolloutPage{Fleet: fleet}
	src, ok := c.cfg.Source.(RolloutSource)
	if !ok {
		c.renderStatus(w, http.StatusNotFound, "error.html", errorView{Title: "No rollouts",
			Error: "this console reads no rollouts (its source has none)"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	s, err := src.Rollout(ctx, fleet)
	if goneSrc, ok := c.cfg.Source.(RolloutGoneSource); ok && errors.Is(err, feed.ErrNoRollout) {
		// Its start aged out of the stream: said as `rollout status`
		// says it, not as a mistyped name.
		if g, gerr := goneSrc.RolloutRemains(ctx, fleet); gerr == nil && g.StartGone() {
			c.renderStatus(w, http.StatusGone, "error.html", errorView{Title: "Fleet " + fleet, Error: g.Gone(fleet), Lines: g.Lines})
			return
		}
	}
	if errors.Is(err, feed.ErrNoRollout) {
		c.renderStatus(w, http.StatusNotFound, "error.html", errorView{Title: "Fleet " + fleet,
			Error: fmt.Sprintf("fleet %s has no rollout in the stream (a mistyped name? /rollouts lists the fleets; 'meshfold apply -f FLEET.yaml' starts one)", fleet)})
		return
	}
	if err != nil {
		p.Error = err.Error()
		c.render(w, "rollout.html", p)
		return
	}
	p.View = s.View()
	now := c.cfg.Now()
	if u := s.Unattended(now); u != nil {
		p.View.Unattended, p.Unattended = u, u.Text(now)
	}
	if np, ok := c.cfg.Source.(NoPlanSource); ok {
		// A failed read leaves the WHY as the rollout says it: the page
		// is drawn again in two seconds.
		hctx, hcancel := context.WithTimeout(ctx, 3*time.Second)
		_, _ = np.NoPlanYet(hctx, &p.View, now)
		hcancel()
	}
	// How many targets have each status, at the top (a fresh user's
	// finding M7: 300 rows and no count), each a link to those targets
	// only.
	for _, st := range rollout.TargetStatuses {
		if n := p.View.Counts[st]; n > 0 {
			p.Counts = append(p.Counts, statusCount{st, n})
		}
	}
	p.Total, _, _ = strings.Cut(p.View.CountsText(), ":")
	if f := r.URL.Query().Get("status"); f != "" {
		if _, err := rollout.ParseStatuses(f); err != nil || strings.Contains(f, ",") {
			c.renderStatus(w, http.StatusBadRequest, "error.html", errorView{Title: "Fleet " + fleet,
				Error: fmt.Sprintf("status %q: not one target status (%v)", f, err)})
			return
		}
		p.Filter = rollout.Status(f)
	}
	for _, t := range p.View.Targets {
		if p.Filter != "" && t.Status != p.Filter {
			continue
		}
		for len(p.Batches) < t.Batch {
			p.Batches = append(p.Batches, nil)
		}
		p.Batches[t.Batch-1] = append(p.Batches[t.Batch-1], t)
		p.Shown++
	}
	c.render(w, "rollout.html", p)
}
