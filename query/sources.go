package query

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
)

// Sources returns, per node, the files its provisioner could not fill
// and why (DESIGN.md §12), as the provisioners keep them in the fill
// status bucket (store.OpenFillStatus): of node, or of every node when
// node is "". They are live: a provisioner writes one as it notices it,
// and deletes it once the file is filled. No bucket yet (no reconciler of
// this version has started) is none.
//
// Errors: the stream's lookup; the bucket's read.
func (r *Reader) Sources(ctx context.Context, node string) (map[string][]audit.SourceProblem, error) {
	_, cfg, err := r.open(ctx)
	if err != nil {
		return nil, err
	}
	kv, err := store.OpenFillStatus(ctx, r.js, cfg, false)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return map[string][]audit.SourceProblem{}, nil
	}
	if err != nil {
		return nil, err
	}
	sts, err := store.ReadFillStatus(ctx, kv, node)
	if err != nil {
		return nil, fmt.Errorf("fill statuses: %w", err)
	}
	out := map[string][]audit.SourceProblem{}
	for _, st := range sts {
		out[st.Node] = append(out[st.Node], audit.SourceProblem{Module: st.Module, Path: st.Path, State: string(st.State),
			Why: st.Why, Since: st.Since})
	}
	return out, nil
}
