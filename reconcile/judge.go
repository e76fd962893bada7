package reconcile

import (
	"fmt"
	"strings"

	"github.com/meshfold/meshfold/events"
)

// Judge decides a filled-file write of path for module by writer against
// the plan the node has settled (DESIGN.md §4, "judge a write"): account
// and rows are that plan's provisioner account and rows; pass "" and nil
// when the node has settled no plan. A held row's files count as declared.
//
// It returns the declared file and an empty reason when the write is
// accepted; otherwise the reason it is refused, checked in this order:
// no-account (the plan names no provisioner account), wrong-account (writer
// is not that account), undeclared (path is not a file of that module in
// that plan). Writing the file, and refusing write-failed when that fails
// or the path escapes the node's root, is the node agent's part.
//
// The node agent calls Judge for every fill request, and the fold calls it
// to learn which settled plan accepts what, so the two never disagree.
func Judge(account string, rows []events.PlanModule, module, path, writer string) (events.File, events.Reason) {
	if account == "" {
		return events.File{}, events.ReasonNoAccount
	}
	if writer != account {
		return events.File{}, events.ReasonWrongAccount
	}
	for i := range rows {
		if rows[i].Name != module {
			continue
		}
		for _, f := range rows[i].Files {
			if f.Path == path {
				return f, ""
			}
		}
	}
	return events.File{}, events.ReasonUndeclared
}

// JudgePlan is Judge against a plan event; p nil means no plan settled.
func JudgePlan(p *events.Plan, module, path, writer string) (events.File, events.Reason) {
	if p == nil {
		return Judge("", nil, module, path, writer)
	}
	return Judge(p.ProvisionerAccount, p.Modules, module, path, writer)
}

// Unfillable says, one line a module, which files a want declares that
// no write can ever fill because the want has no provisioner module: a
// plan's provisioner account is the runs_as of the want's provisioner
// module ([State.Compose]), so a plan of a want without one names no
// account and [Judge] refuses every write (no-account). want, apply and
// their dry runs warn of it before anything moves (a fresh user's
// finding U25: the rollout found out at healthy_deadline, "its plan
// names no provisioner, so nothing fills it"). nil when the want has a
// provisioner module or declares no file.
func Unfillable(modules []events.WantModule) []string {
	var out []string
	for _, m := range modules {
		if m.Provisioner {
			return nil
		}
	}
	for _, m := range modules {
		if len(m.Files) == 0 {
			continue
		}
		paths := make([]string, len(m.Files))
		for i, f := range m.Files {
			paths[i] = f.Path
		}
		them := "it"
		if len(paths) > 1 {
			them = "them"
		}
		out = append(out, fmt.Sprintf("%s declares %s but this want has no provisioner module: the node accepts no write of %s",
			m.Name, strings.Join(paths, ", "), them))
	}
	return out
}
