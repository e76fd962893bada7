package waitfor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeT records a failure instead of ending the goroutine, so the test
// can read the message.
type fakeT struct {
	testing.TB
	msg string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
}

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	Until(t, 5*time.Second, "three polls", func() bool { return n.Add(1) == 3 })
	if n.Load() != 3 {
		t.Errorf("polled %d times, want 3", n.Load())
	}
}

func TestUntilFailsWithWhatItWaitedFor(t *testing.T) {
	f := &fakeT{TB: t}
	Until(f, 20*time.Millisecond, "the impossible", func() bool { return false })
	if !strings.Contains(f.msg, "timed out after") || !strings.HasSuffix(f.msg, "waiting for the impossible") {
		t.Errorf("failure %q", f.msg)
	}
}

func TestValueQuotesWhatItLastSaw(t *testing.T) {
	f := &fakeT{TB: t}
	n := 0
	Value(f, 20*time.Millisecond, "seven", func() (int, bool) { n++; return n, n == -1 })
	if want := fmt.Sprintf("waiting for seven; last saw %d", n); !strings.HasSuffix(f.msg, want) {
		t.Errorf("failure %q, want it to end %q", f.msg, want)
	}
	if v := Value(t, 5*time.Second, "two", func() (int, bool) { n++; return n, n%2 == 0 }); v%2 != 0 {
		t.Errorf("Value returned %d, not the value that held", v)
	}
}

func TestUntilOnWakesOnANotification(t *testing.T) {
	wake := make(chan struct{}, 1)
	var ready atomic.Bool
	go func() {
		ready.Store(true)
		wake <- struct{}{}
	}()
	UntilOn(t, 5*time.Second, "ready", wake, ready.Load)
}

func TestPollEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	v, err := Poll(ctx, "a negative", func() (int, bool) { return 4, false })
	if !errors.Is(err, context.DeadlineExceeded) || v != 4 || !strings.Contains(err.Error(), "waiting for a negative (last saw 4)") {
		t.Errorf("Poll: %d, %v", v, err)
	}
}
