package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// A write cut by its context's end ends with that context's cause, also
// when the write itself returns context.Canceled (a request whose context
// was cancelled), not only when its last attempt went unanswered: a
// lost lease cancels the final checkpoint's context with its loss, and a
// bare context.Canceled was taken by partition.run for a stop with
// nothing to write, so the unwritten snapshot was not in Unsaved.
func TestRetryEndsWithItsContextsCause(t *testing.T) {
	t.Parallel()
	p := &partition{}
	cause := fmt.Errorf("%w: taken by another member", ErrLeaseLost)
	ctx, cancel := context.WithCancelCause(context.Background())
	err := p.retry(ctx, func(actx context.Context) (bool, error) {
		cancel(cause)
		return false, actx.Err() // context.Canceled
	})
	if !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("retry = %v, want the context's cause (%v)", err, cause)
	}
	// A write that fails on its own, its context live, keeps its error.
	own := errors.New("refused")
	if err := p.retry(context.Background(), func(context.Context) (bool, error) { return false, own }); !errors.Is(err, own) {
		t.Fatalf("retry = %v, want %v", err, own)
	}
}
