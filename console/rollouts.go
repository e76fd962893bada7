package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

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

// The pages are live through static/refresh.js: every two seconds it
// fetches the page again and swaps in its body, until the rollout is
// final.
type rolloutsPage struct {
	Views []rolloutRow
	Error string
}

// rolloutRow is one fleet's line of the list.
type rolloutRow struct {
	rollout.View
	Done int
}

type rolloutPage struct {
	Fleet   string
	View    rollout.View
	Batches [][]rollout.TargetView
	Error   string
	// Unattended says, as of the page's clock, that no controller acts
	// on the rollout (rollout.State.Unattended); empty otherwise.
	Unattended string
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
	for _, f := range fleets {
		s, err := src.Rollout(ctx, f)
		if err != nil {
			p.Error = err.Error()
			continue
		}
		v := s.View()
		v.Targets = nil
		p.Views = append(p.Views, rolloutRow{View: v, Done: v.Counts[rollout.Done]})
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
	for _, t := range p.View.Targets {
		for len(p.Batches) < t.Batch {
			p.Batches = append(p.Batches, nil)
		}
		p.Batches[t.Batch-1] = append(p.Batches[t.Batch-1], t)
	}
	c.render(w, "rollout.html", p)
}
