package provision

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
)

// Each cause of a trust refusal (untrusted, retired past its overlap,
// unsigned), after the longest effect name it follows ("knock #" and a
// 10-digit sequence), is shown whole where state, fleet and poke print it
// (events.ErrorText cuts longer text in its middle, where the key is),
// and names the key.
func TestUntrustedCauseShownWhole(t *testing.T) {
	kp, err := store.NewSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	signer, _ := store.NewSigner(kp)
	key := signer.PublicKey()
	other, _ := store.NewSigningKey()
	otherPub, _ := other.PublicKey()
	h := nats.Header{}
	h.Set(jetstream.MsgIDHeader, "ace.knock.1.0")
	if err := signer.Sign(h, "ace", events.KindKnock, "ace.knock.1.0", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	untrusted, _ := store.NewTrust(otherPub)
	retired, _ := store.NewTrust(otherPub)
	if _, err := retired.Retire(key, time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		trust *store.Trust
		h     nats.Header
		want  string
	}{
		{"untrusted", untrusted, h, "is signed by key " + key + ", which this provisioner does not trust: if it is the reconciler's, add it to --trust"},
		{"retired", retired, h, "is signed by key " + key + ", retired past its overlap (since "},
		{"unsigned", untrusted, nats.Header{}, "is not signed"},
	} {
		err := tc.trust.Verify("ace", events.KindKnock, tc.h, []byte("{}"))
		if err == nil {
			t.Fatalf("%s: verified", tc.name)
		}
		why := fmt.Sprintf("knock #%d %s", uint64(9_999_999_999), untrustedCause(tc.h.Get(store.HeaderSigner), err))
		if !strings.HasPrefix(why, "knock #9999999999 "+tc.want) {
			t.Errorf("%s: %q, want it to start %q", tc.name, why, tc.want)
		}
		if shown := events.ErrorText(why); shown != why {
			t.Errorf("%s: cut where it is shown (%d bytes): %s", tc.name, len(why), shown)
		}
	}
}
