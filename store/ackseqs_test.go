package store

import "testing"

// TestAckSeqs: the consumer sequence and pending count of a reply subject
// in both of the server's forms; anything else is refused.
func TestAckSeqs(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		reply         string
		cseq, pending uint64
		ok            bool
	}{
		{"$JS.ACK.KV_M.c1.1.907.12.1700000000000000000.99", 12, 99, true},
		{"$JS.ACK.dom.ACCHASH.KV_M.c1.1.907.12.1700000000000000000.99.rnd", 12, 99, true},
		{"$JS.ACK._.ACCHASH.KV_M.c1.1.907.7.1700000000000000000.0", 7, 0, true},
		{"", 0, 0, false},
		{"_INBOX.x", 0, 0, false},
		{"$JS.ACK.KV_M.c1.1.907", 0, 0, false},
		{"$JS.ACK.KV_M.c1.1.907.x.1700000000000000000.99", 0, 0, false},
	} {
		cseq, pending, ok := ackSeqs(c.reply)
		if ok != c.ok || ok && (cseq != c.cseq || pending != c.pending) {
			t.Errorf("ackSeqs(%q) = %d, %d, %v; want %d, %d, %v", c.reply, cseq, pending, ok, c.cseq, c.pending, c.ok)
		}
	}
}
