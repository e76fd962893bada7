package storetest

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// Consumers lists stream's consumers, every page, and returns the
// listing's error. It reads the lister's channel to its end whatever it
// finds: jetstream.Stream.ListConsumers's goroutine (nats.go v1.55.0)
// sends each info without watching its context, so a reader that stops
// early (a match found, a test failed) leaves it blocked on its send for
// the process's life, with the request's connection (one seen 15 minutes
// in a timed-out CI's goroutine dump of the engine tests). The caller
// picks from the whole list. jetstream.ErrEndOfData is no error.
func Consumers(ctx context.Context, stream jetstream.Stream) ([]*jetstream.ConsumerInfo, error) {
	l := stream.ListConsumers(ctx)
	var out []*jetstream.ConsumerInfo
	for info := range l.Info() {
		out = append(out, info)
	}
	// Err is written before the channel closes: read after the range.
	if err := l.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		return out, err
	}
	return out, nil
}
