package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// A lookup of the stream JetStream did not answer says a cluster just
// started may have no JetStream leader yet, not only "context deadline
// exceeded" (a fresh user's finding V10); other errors are said as they
// are.
func TestLookupErrorOfNoLeaderYet(t *testing.T) {
	t.Parallel()
	for _, err := range []error{context.DeadlineExceeded, fmt.Errorf("nats: %w", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"})} {
		got := lookupError("MESH", err)
		if !errors.Is(got, err) || !strings.Contains(got.Error(), "look up stream MESH: JetStream did not answer (") ||
			!strings.Contains(got.Error(), "a cluster just started has no JetStream leader for its first seconds") {
			t.Errorf("lookupError(%v) = %v", err, got)
		}
	}
	if got := lookupError("MESH", errors.New("nats: permissions violation")); got.Error() != "look up stream MESH: nats: permissions violation" {
		t.Errorf("lookupError of another error = %v", got)
	}
}
