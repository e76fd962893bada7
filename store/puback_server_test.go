package store_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestPubAckOfTheServerReadWithoutReflection: the answers a server
// gives to publishes (an ack, a duplicate, a stale fence), taken from a
// real server, are read without encoding/json, as encoding/json reads
// them; and decode turns them into what the client's futures carried.
func TestPubAckOfTheServerReadWithoutReflection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, nc, js := storetest.Start(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ACKS", Subjects: []string{"acks.>"}}); err != nil {
		t.Fatal(err)
	}
	ask := func(id, expect string) []byte {
		m := nats.NewMsg("acks.ace")
		m.Data = []byte("x")
		m.Header.Set(jetstream.MsgIDHeader, id)
		if expect != "" {
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, expect)
		}
		r, err := nc.RequestMsgWithContext(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return r.Data
	}
	for _, c := range []struct {
		name, id, expect string
		ack              jetstream.PubAck
		code             jetstream.ErrorCode
	}{
		{"stored", "a", "0", jetstream.PubAck{Stream: "ACKS", Sequence: 1}, 0},
		{"duplicate", "a", "", jetstream.PubAck{Stream: "ACKS", Sequence: 1, Duplicate: true}, 0},
		{"stale fence", "b", "0", jetstream.PubAck{}, jetstream.JSErrCodeStreamWrongLastSequence},
	} {
		data := ask(c.id, c.expect)
		if !store.PubAckReadAsJSON(t, data) {
			t.Errorf("%s: the server's answer %q left to encoding/json", c.name, data)
		}
		ack, err := store.DecodeAnswer(data)
		switch {
		case c.code != 0:
			apiErr, ok := err.(*jetstream.APIError)
			if !ok || apiErr.ErrorCode != c.code || ack != nil {
				t.Errorf("%s: %q read as %+v, %v; want API error %d", c.name, data, ack, err, c.code)
			}
		case err != nil || !reflect.DeepEqual(*ack, c.ack):
			t.Errorf("%s: %q read as %+v, %v; want %+v", c.name, data, ack, err, c.ack)
		}
	}
}
