package store_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// recordHandler sends each record logged with message msg to c.
type recordHandler struct {
	msg string
	c   chan slog.Record
}

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.c <- r.Clone()
	}
	return nil
}
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordHandler) WithGroup(string) slog.Handler      { return h }

// A connection that loses its server logs the URL it was connected to
// (nats.Conn.ConnectedUrl is empty by the time the disconnect handler
// runs), never url="".
func TestDisconnectLogsLastURL(t *testing.T) {
	t.Parallel()
	srv, _, _ := storetest.Start(t)
	h := recordHandler{msg: "nats disconnected", c: make(chan slog.Record, 16)}
	nc, err := store.Connect(store.ConnectConfig{URLs: []string{srv.ClientURL()}, Name: "t", Logger: slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	want := nc.ConnectedUrlRedacted()
	srv.Shutdown()
	select {
	case r := <-h.c:
		var url string
		var has bool
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "url" {
				url, has = a.Value.String(), true
			}
			return true
		})
		if !has || url != want {
			t.Errorf("disconnect logged url %q (present %v), want %q", url, has, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no disconnect logged")
	}
}
