package console_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/console"
	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestAsOfPartial reads a real stream through the read side: the as-of
// view of a bound between ace's events reads ace's history only up to
// the bound, so it must not say the bound is after ace's last event (ace
// has a later one); it says which event of ace is the last at or before
// it, as `meshfold audit --as-of` does. A stream that lost its first
// events is said so too.
func TestAsOfPartial(t *testing.T) {
	t.Parallel()
	_, nc, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub := store.NewPublisher(js, cfg.Subjects())
	at := time.Now()
	for _, e := range []struct {
		node string
		p    events.Payload
	}{
		{"ace", events.Stamp(&events.Want{Modules: []events.WantModule{provisioner}}, at)},
		{"bob", events.Stamp(&events.Want{Modules: []events.WantModule{provisioner}}, at)},
		{"ace", events.Stamp(&events.Want{Modules: []events.WantModule{provisioner, mbgMod}}, at)},
	} {
		if _, err := pub.Append(ctx, e.node, e.p); err != nil {
			t.Fatal(err)
		}
	}
	r, err := query.New(nc, query.Config{Stream: cfg, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c, err := console.New(console.Config{Source: r})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	defer srv.Close()
	fx := &fixture{srv: srv}

	code, body := fx.get(t, "/node/ace?as_of=2")
	if code != 200 {
		t.Fatalf("as of #2: %d\n%s", code, body)
	}
	if strings.Contains(body, "after ace&#39;s last event") || strings.Contains(body, "after ace's last event") {
		t.Errorf("the as-of view of a bounded read says #2 is after ace's last event (ace has #3):\n%s", body)
	}
	if !strings.Contains(body, "#2 is not an event of ace; the last event of ace at or before it is #1") {
		t.Errorf("the as-of view does not say ace's last event at or before #2:\n%s", body)
	}

	// The stream loses its first events: the page says where ace's
	// history now begins, as `meshfold audit` does.
	stream, err := js.Stream(ctx, cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(3)); err != nil {
		t.Fatal(err)
	}
	code, body = fx.get(t, "/node/ace")
	if code != 200 || !strings.Contains(body, "the stream begins at sequence 3") || !strings.Contains(body, "history here begins at #3") {
		t.Errorf("a trimmed stream: %d\n%s", code, body)
	}
}
