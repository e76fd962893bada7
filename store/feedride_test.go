package store_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// A node's feed (store.FollowNode: a node agent's plans, a provisioner's
// knocks) reads a message published after a kill -9 of the server leading
// the stream, without that server coming back (fresh7 G2). With the
// client's ordered consumer, a feed whose consumer was re-made (its
// connection was to the killed server, or its consumer was on it) kept
// asking for one consumer name, which the meta leader had placed on the
// killed server: unanswered, then "consumer offline", until that server
// returned; the feed read nothing and said nothing. Each feed also says
// so in its log: a warning once when its feed is lost, an info when it
// reads again.
func TestFollowNodeRidesOutAStreamLeaderKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills a server and waits for an election: not in -short")
	}
	pc := storetest.StartProcCluster(t, 3)
	meta := pc.MetaLeader()
	if meta < 0 {
		t.Fatal("no meta leader")
	}
	_, js := pc.ConnectVia(t, meta)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}

	type read struct {
		node  string
		cause uint64
		at    time.Time
	}
	// Feeds on connections spread over the three servers: at each kill a
	// third reconnect (and re-make their consumer at once), and about a
	// third lose a consumer the killed server held (after two missed
	// heartbeats). The window in which the meta leader still places a
	// new consumer on the killed server is short (until its next
	// commit), so the kills are several.
	const feeds, kills = 24, 3
	reads := make(chan read, 4*feeds)
	logs := make([]*recordLog, feeds)
	fctx, fcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { fcancel(); wg.Wait() }()
	nodes := make([]string, feeds)
	for i := range feeds {
		nodes[i] = fmt.Sprintf("n%02d", i)
		_, fjs := pc.ConnectVia(t, i%pc.N())
		logs[i] = &recordLog{}
		node := nodes[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			store.FollowNode(fctx, fjs, store.NodeFollow{Stream: cfg, Node: node, Kind: events.KindKnock,
				Log: slog.New(logs[i]),
				Handle: func(_ context.Context, m store.Msg) {
					reads <- read{node: node, cause: m.Event.Payload.(*events.Knock).Cause, at: time.Now()}
				}})
		}()
	}
	pub := store.NewPublisher(js, cfg.Subjects())
	handed := map[string][]uint64{} // each feed's knocks handed on, in order
	// publishAll publishes a knock of cause for every feed's node and
	// waits for every feed to read it, by within; it returns each read's
	// time from since and the feeds that read none.
	publishAll := func(cause uint64, since time.Time, what string, within time.Duration) (map[string]time.Duration, []string) {
		t.Helper()
		for _, n := range nodes {
			if _, err := pub.AppendRetrying(ctx, n, knock(cause)); err != nil {
				t.Fatalf("knock %d of %s: %v", cause, n, err)
			}
		}
		t.Logf("knocks %d stored %s after %s", cause, time.Since(since).Round(time.Millisecond), what)
		got := map[string]time.Duration{}
		timer := time.NewTimer(within)
		defer timer.Stop()
		for len(got) < feeds {
			select {
			case r := <-reads:
				handed[r.node] = append(handed[r.node], r.cause)
				if r.cause == cause {
					got[r.node] = r.at.Sub(since)
				}
			case <-timer.C:
				var missing []string
				for _, n := range nodes {
					if _, ok := got[n]; !ok {
						missing = append(missing, n)
					}
				}
				return got, missing
			}
		}
		return got, nil
	}
	if _, missing := publishAll(1, time.Now(), "their publish began", time.Minute); missing != nil {
		t.Fatalf("before the kills, no knock read by %v", missing)
	}

	for k := range kills {
		// The killed server leads the stream, not the meta group (G2's
		// placement); the test publishes through the meta leader.
		killed := (meta + 1 + k%2) % pc.N()
		if err := pc.MoveLeader(ctx, js, cfg.Name, killed); err != nil {
			t.Fatal(err)
		}
		if now := pc.MetaLeader(); now != meta {
			t.Skipf("the meta leader moved from %s to %s meanwhile", pc.Name(meta), pc.Name(now))
		}
		pc.Kill(killed)
		kill := time.Now()
		// An election takes 4–9 s, a lost consumer is seen after two
		// missed heartbeats (10 s); a minute is far past both on a loaded
		// machine, and the killed server stays down meanwhile.
		got, missing := publishAll(uint64(2+k), kill, "the kill", time.Minute)
		var worst time.Duration
		for _, d := range got {
			worst = max(worst, d)
		}
		t.Logf("kill %d (%s, the stream's leader): %d of %d feeds read the knock published after it, the last %s after the kill",
			k+1, pc.Name(killed), len(got), feeds, worst.Round(time.Millisecond))
		if missing != nil {
			t.Fatalf("kill %d: no knock read %s after the kill of %s, the stream's leader (not restarted), by %v",
				k+1, time.Since(kill).Round(time.Second), pc.Name(killed), missing)
		}
		pc.Restart(killed)
		if err := pc.WaitHealthy(killed, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	// Exactly once, in order: each knock was published after the one
	// before was read, so none is coalesced either.
	for done := false; !done; {
		select {
		case r := <-reads:
			handed[r.node] = append(handed[r.node], r.cause)
		default:
			done = true
		}
	}
	wantHanded := make([]uint64, kills+1)
	for i := range wantHanded {
		wantHanded[i] = uint64(i + 1)
	}
	for _, n := range nodes {
		if !slices.Equal(handed[n], wantHanded) {
			t.Errorf("%s was handed knocks %v, want %v: each once, in order", n, handed[n], wantHanded)
		}
	}
	lost, longest := 0, 0
	for i, l := range logs {
		// Each loss is said once (warn) and its end once (info): the
		// two alternate, and the feed, reading, ends on an info.
		said := l.said(map[string]string{"WARN knock feed lost": "lost", "INFO knock feed reads again": "again"})
		ok := len(said)%2 == 0
		for j, w := range said {
			ok = ok && w == []string{"lost", "again"}[j%2]
		}
		if !ok {
			t.Errorf("%s said %v of its feed, want each loss once and then its end once:\n%s", nodes[i], said, l)
		}
		lost += len(said) / 2
		if l.longestLoss() > logs[longest].longestLoss() {
			longest = i
		}
	}
	t.Logf("feeds lost and read again over %d kills: %d; the longest loss, %s's:\n%s", kills, lost, nodes[longest], logs[longest])
}

// recordLog is a slog.Handler keeping each record as a line: its level,
// message and attributes.
type recordLog struct {
	mu    sync.Mutex
	lines []string
}

func (r *recordLog) Enabled(context.Context, slog.Level) bool { return true }
func (r *recordLog) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recordLog) WithGroup(string) slog.Handler            { return r }

func (r *recordLog) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Level.String() + " " + rec.Message)
	rec.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, b.String())
	return nil
}

// said returns, in order, the names of the records that begin with one
// of the prefixes ("LEVEL message") of names.
func (r *recordLog) said(names map[string]string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, l := range r.lines {
		for prefix, name := range names {
			if strings.HasPrefix(l, prefix) {
				out = append(out, name)
			}
		}
	}
	return out
}

// longestLoss returns the longest lost_for of its records.
func (r *recordLog) longestLoss() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var most time.Duration
	for _, l := range r.lines {
		if _, v, ok := strings.Cut(l, "lost_for="); ok {
			d, _ := time.ParseDuration(strings.Fields(v)[0])
			most = max(most, d)
		}
	}
	return most
}

func (r *recordLog) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.lines, "\n")
}
