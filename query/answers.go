package query

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshfold/meshfold/store"
)

// StreamAnswerTimeout bounds [Reader.StreamAnswers]' one request.
const StreamAnswerTimeout = 2 * time.Second

// ErrStreamSilent: the stream did not answer within its bound, or
// answered that it has no leader (a cluster that lost its quorum or is
// electing one): nothing can be stored in it or read from it now.
var ErrStreamSilent = errors.New("query: the stream does not answer")

// StreamAnswers asks the stream's leader for the stream's info once,
// within [StreamAnswerTimeout]: nil when it answered naming a leader (or
// on a single server, which has no cluster); else an error matching
// [ErrStreamSilent] that says what happened. The console asks it every
// few seconds so that its fleet page never shows an outage's last view as
// the fleet now (a fresh user's finding: "Nothing needs an operator" with
// the time of the request, while the stream had no leader).
func (r *Reader) StreamAnswers(ctx context.Context) error {
	s, _, err := r.open(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStreamSilent, err)
	}
	ctx, cancel := context.WithTimeout(ctx, StreamAnswerTimeout)
	defer cancel()
	info, err := s.Info(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("%w: stream %s: %w", ErrStreamSilent, s.CachedInfo().Config.Name, err)
	case info.Cluster != nil && info.Cluster.Leader == "":
		return fmt.Errorf("%w: stream %s has no leader", ErrStreamSilent, info.Config.Name)
	}
	return nil
}

// StoreStatus asks serve what it knows of its store
// ([RequestStoreStatus], within [DefaultTimeout]): whether it takes
// writes, since when not, and why. The console asks it beside
// [Reader.StreamAnswers]: a stream whose store takes no write still
// answers every read (a fresh user's finding G1).
func (r *Reader) StoreStatus(ctx context.Context) (store.StoreStatus, error) {
	return RequestStoreStatus(ctx, r.nc, r.pre, DefaultTimeout)
}
