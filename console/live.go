package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/store"
)

// fleet is the console's picture of every node: the views loaded from
// the snapshots at start, each replaced by the reconciler's live view
// once an event of the node folds. Rows are made from views with
// audit.FleetRowOfView at render time, so ages are always told against
// the present.
type fleet struct {
	src Source
	log *slog.Logger

	mu    sync.Mutex
	views map[string]NodeView
	// warnings are the stream sequences of each node's journal entries
	// of level warn or error, sorted and unique.
	warnings map[string][]uint64
	// dirty maps a node to the newest sequence of it seen on the stream
	// that its view does not cover yet.
	dirty map[string]uint64
	// last maps a node to the newest sequence of it seen on the stream
	// since the console started following.
	last map[string]uint64
	gen  uint64
	subs map[chan struct{}]struct{}
	wake chan struct{}
	// sources are the provisioners' reports of unfilled files, per node
	// (pollSources).
	sources map[string][]audit.SourceProblem
	// idx is the fleet's rows as last made (index); later: a notify is
	// due once a newer index may be made; building: one is being made.
	idx             *fleetIndex
	later, building bool
	// made is closed when the index being made is in (building).
	made chan struct{}
	// loaded: the snapshots have been read (load); unread: why they
	// could not be. Until loaded, no page shows the fleet: an empty
	// picture would say "0 nodes, nothing needs an operator" (a fresh
	// user's finding M7).
	loaded bool
	unread error
	// noSnapshots: the last load found no snapshot bucket (no reconciler
	// has checkpointed the stream yet): the page says the fleet shown is
	// partial, and Run loads it again once one has (awaitSnapshots).
	noSnapshots bool
	// silent is why the stream did not answer at the last look
	// (watchStream), nil when it did; silentSince when it first did
	// not. lastSeq and lastAt are the newest event the follow saw and
	// when it was stored.
	silent      error
	silentSince time.Time
	// store is what serve said of its store at the last look
	// (watchStream): the fleet page opens with it when it takes no write.
	store   store.StoreStatus
	lastSeq uint64
	lastAt  time.Time
	// wall is the wall clock the indexes are timed by (time.Now; tests
	// move it).
	wall func() time.Time
	// unanswered maps a dirty node whose live view no reconciler gave
	// (query.ErrNoReconciler) to when it was first asked so: its row is
	// older than its events, and stays so until a reconciler folds them
	// (every reconciler down, or its partition's during a takeover).
	// noneSince is when the refresh last began to find no reconciler
	// answering any node (zero: one answered at its last round).
	unanswered map[string]time.Time
	noneSince  time.Time
}

// indexEvery is the least wall time between two fleet indexes.
const indexEvery = time.Second

// indexMaxAge is the most wall time between a page's request and the
// copy of the fleet its index was made of, the fleet having changed
// since (or time having moved on): an older index is not shown, the
// page waits for a newer one (a fresh user's finding M7: a console
// nobody had looked at for 25 minutes answered from the index made at
// its first request, "0 nodes · Nothing needs an operator", while 41 of
// 60 nodes had failed).
const indexMaxAge = 3 * indexEvery

func newFleet(src Source, log *slog.Logger) *fleet {
	return &fleet{src: src, log: log, views: map[string]NodeView{}, warnings: map[string][]uint64{},
		dirty: map[string]uint64{}, unanswered: map[string]time.Time{}, last: map[string]uint64{}, subs: map[chan struct{}]struct{}{}, wake: make(chan struct{}, 1),
		wall: time.Now}
}

// load reads every snapshot and the journal warnings since since. Until
// it has, the pages say the fleet is loading; when it fails, they say
// the fleet could not be read, and why (fleetPage.Unread), and the
// failure is logged.
//
// noSnapshots reports that the snapshot bucket does not exist yet (no
// reconciler has checkpointed): the fleet is loaded empty then, and the
// pages say so.
func (f *fleet) load(ctx context.Context, since time.Time) (noSnapshots bool, err error) {
	defer func() {
		if err != nil && ctx.Err() == nil {
			f.log.Error("console: the fleet could not be read; the fleet page says so", "err", err)
			f.mu.Lock()
			f.unread = err
			f.changed()
			f.mu.Unlock()
		}
	}()
	nvs, err := f.src.Fleet(ctx)
	if errors.Is(err, query.ErrNoSnapshots) {
		// No reconciler checkpointed yet: an empty fleet, said partial.
		nvs, err, noSnapshots = nil, nil, true
	}
	if err != nil {
		return false, fmt.Errorf("console: %w", err)
	}
	var seqs map[string][]uint64
	if !since.IsZero() {
		if seqs, err = f.src.WarningSeqs(ctx, since); err != nil {
			return false, fmt.Errorf("console: journal warnings: %w", err)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loaded, f.unread, f.noSnapshots = true, nil, noSnapshots
	for _, nv := range nvs {
		// A live view already taken in is newer than the snapshot.
		if old, ok := f.views[nv.Node]; !ok || old.View.Seq < nv.View.Seq {
			f.views[nv.Node] = nv
		}
	}
	for n, ss := range seqs {
		// The follow may have seen some of them already.
		all := append(f.warnings[n], ss...)
		slices.Sort(all)
		f.warnings[n] = slices.Compact(all)
	}
	f.changed()
	return noSnapshots, nil
}

// catchUp reads which nodes have events past their partition's
// checkpoint in lag (Source.TailNodes) that their loaded view is older
// than (query.LaggingNodes, the rule `meshfold fleet`'s table reads live
// by), and marks them dirty up to their newest such event: refresh reads
// them live from the reconciler as it does a node of a new event. Called
// once the snapshots of lag are loaded.
func (f *fleet) catchUp(ctx context.Context, lag query.SnapshotLag) {
	if len(lag.Behind()) == 0 {
		return
	}
	tail, complete, err := f.src.TailNodes(ctx, lag, query.DefaultTailMax)
	if err != nil {
		if ctx.Err() == nil {
			f.log.Warn("console: the events past the snapshots' checkpoints could not be read; rows of nodes with such events may be older than them until their next one", "err", err)
		}
		return
	}
	if !complete {
		f.log.Warn("console: more events past a snapshot checkpoint than read; rows of nodes with events past them may be older than them until their next one", "read", query.DefaultTailMax)
	}
	f.mu.Lock()
	lagging := query.LaggingNodes(tail, func(node string) (uint64, bool) {
		nv, ok := f.views[node]
		return nv.View.Seq, ok && nv.Err == nil
	})
	for _, node := range lagging {
		f.dirty[node] = max(f.dirty[node], tail[node])
	}
	f.mu.Unlock()
	if len(lagging) > 0 {
		f.log.Info("console: the snapshots lag the stream; reading those nodes live", "nodes", len(lagging))
		select {
		case f.wake <- struct{}{}:
		default:
		}
	}
}

// saw records an event from the stream: its node's view is refreshed
// from the reconciler once it has folded it.
func (f *fleet) saw(ev events.Event) {
	f.mu.Lock()
	if ev.Kind == events.KindJournal {
		if j, ok := ev.Payload.(*events.Journal); ok && j.Level != events.LevelInfo {
			if ws := f.warnings[ev.Node]; !slices.Contains(ws, ev.Seq) {
				f.warnings[ev.Node] = append(ws, ev.Seq)
				slices.Sort(f.warnings[ev.Node])
			}
		}
	}
	if ev.Seq > f.lastSeq {
		f.lastSeq, f.lastAt = ev.Seq, ev.Time
	}
	f.dirty[ev.Node] = max(f.dirty[ev.Node], ev.Seq)
	f.last[ev.Node] = max(f.last[ev.Node], ev.Seq)
	f.notify() // node pages: a newer event, before it folds
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// refreshRetry is how long a node whose event the reconciler has not
// folded yet waits before it is asked again.
const refreshRetry = 50 * time.Millisecond

// refreshMaxRetry bounds the wait between two asks while the reconciler
// makes no progress (down, or not folding).
const refreshMaxRetry = 5 * time.Second

// refresh asks the reconciler for the view of every dirty node until ctx
// is done. A node stays dirty until the view covers the newest event seen
// of it; with no reconciler answering, it keeps its last view.
func (f *fleet) refresh(ctx context.Context) {
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	delay := refreshRetry
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
		case <-retry.C:
		}
		f.mu.Lock()
		dirty := maps.Clone(f.dirty)
		f.mu.Unlock()
		again, progress := false, false
		answered, unanswered := false, false
		for node, seq := range dirty {
			v, _, err := f.src.Live(ctx, node)
			switch {
			case errors.Is(err, query.ErrNoReconciler):
				f.mu.Lock()
				if _, ok := f.unanswered[node]; !ok && f.dirty[node] != 0 {
					f.unanswered[node] = f.wall()
					f.changed()
				}
				f.mu.Unlock()
				again, unanswered = true, true
				continue
			case errors.Is(err, query.ErrUnknownNode):
				f.answered(node)
				again, answered = true, true // not folded yet
				continue
			case err != nil:
				if ctx.Err() != nil {
					return
				}
				f.log.Warn("console: live view", "node", node, "err", err)
				again = true
				continue
			}
			f.answered(node)
			answered = true
			f.mu.Lock()
			if old, ok := f.views[node]; !ok || old.View.Seq < v.Seq || old.Err != nil {
				f.views[node] = NodeView{Node: node, View: v}
				f.changed()
				progress = true
			}
			if v.Seq >= seq && f.dirty[node] == seq {
				delete(f.dirty, node)
			} else {
				again = true
			}
			f.mu.Unlock()
		}
		f.mu.Lock()
		switch {
		case answered && !f.noneSince.IsZero():
			f.noneSince = time.Time{}
			f.changed()
		case unanswered && !answered && f.noneSince.IsZero():
			f.noneSince = f.wall()
			f.changed()
		}
		f.mu.Unlock()
		// A reconciler that lags is asked again soon; one that is down or
		// stuck, less and less often (up to refreshMaxRetry).
		if progress {
			delay = refreshRetry
		} else if again {
			delay = min(2*delay, refreshMaxRetry)
		}
		if again {
			retry.Reset(delay)
		}
	}
}

// answered records that a reconciler answered for node (its view, or
// that it has folded nothing of it).
func (f *fleet) answered(node string) {
	f.mu.Lock()
	if _, ok := f.unanswered[node]; ok {
		delete(f.unanswered, node)
		f.changed()
	}
	f.mu.Unlock()
}

// changed bumps the generation and wakes every subscriber; f.mu is held.
func (f *fleet) changed() {
	f.gen++
	f.notify()
}

// notify wakes every subscriber; f.mu is held.
func (f *fleet) notify() {
	for ch := range f.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// subscribe returns a channel told of every change, and its cancel.
func (f *fleet) subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	f.mu.Lock()
	f.subs[ch] = struct{}{}
	f.mu.Unlock()
	return ch, func() {
		f.mu.Lock()
		delete(f.subs, ch)
		f.mu.Unlock()
	}
}

// fleetPage is what the fleet page shows: a summary of the whole fleet
// (how many nodes share each need, each a link), then one page of the
// nodes needing an operator, most pressing first, and one page of every
// node by name, both of the nodes matching the search (Query: a part of
// the name or of a need) and the need chosen (Need).
type fleetPage struct {
	// Summary counts the nodes of the fleet (retired ones only with All)
	// per need, most pressing need first, then those needing nothing
	// (audit.NeedNothing), each a link.
	Summary []needGroup
	// Needs are the page's rows needing an operator, most pressing first
	// (audit.SortFleet); NeedsFirst is the index of the first among the
	// NeedsTotal matching ones, NeedsMore how many follow this page.
	Needs      []audit.FleetRow
	NeedsFirst int
	NeedsTotal int
	NeedsMore  int
	NeedsPager pager
	// Rows are the page's rows of every matching node, by name; RowsFirst
	// the first's index among the Matching ones, More how many follow.
	Rows      []audit.FleetRow
	RowsFirst int
	More      int
	RowsPager pager
	Matching  int
	// RetiredOut counts the retired nodes left out (All: none are).
	RetiredOut int
	All        bool
	Query      string
	Need       string
	Gen        uint64
	Nodes      int
	// Now is the time the rows are as of.
	Now time.Time
	// Loading: the snapshots have not been read yet; Unread: why they
	// could not be. Either way the page shows no fleet, and is answered
	// 503: never "0 nodes, nothing needs an operator" of a fleet not
	// read (a fresh user's finding M7).
	Loading bool
	Unread  string
	// NoSnapshots: no reconciler has checkpointed the stream yet, so the
	// fleet shown is only the nodes folded since the console started
	// (a fresh user's finding, M7's edge): never "Nothing needs an
	// operator" of it.
	NoSnapshots bool
	// Silent says why the stream does not answer (since SilentSince):
	// nothing can be stored or read, and the page is as of the last
	// event the console saw, LastSeq stored at LastAt (0: none since it
	// started), not of Now.
	Silent      string
	SilentSince time.Time
	// StoreFull, when set, is serve's word that its store takes no
	// write (store.StoreStatus.Headline): since when, why, what to do.
	StoreFull string
	LastSeq   uint64
	LastAt    time.Time
	// Behind counts the rows older than their nodes' events, which no
	// reconciler answered for since UnansweredSince: their rows say so
	// (audit.FleetRow.Behind), and "as of" is not theirs (a fresh user's
	// finding m1). NoReconciler is when no reconciler answered for any
	// node (zero: one answers): the page says so first (M9).
	Behind          int
	UnansweredSince time.Time
	NoReconciler    time.Time
	// Live is the page's live stream: the same page, as server-sent
	// events.
	Live string
	// Clamped says of each page asked past its table's last that the
	// last is shown instead.
	Clamped []string
}

// needGroup is one line of the fleet page's summary; Calm: the nodes
// needing nothing (Need is audit.NeedNothing).
type needGroup struct {
	Need   string
	Nodes  int
	Href   string
	Chosen bool
	Calm   bool
}

// pager links a table's pages ("" where there is none).
type pager struct {
	Prev, Next string
	Page, Of   int
}

// MaxRows is the most rows each table of the fleet page shows: a page;
// the rest are counted, paged (?page=N for the nodes needing an
// operator, ?npage=N for every node) and found with the search.
const MaxRows = 50

// fleetQuery is what the fleet page is asked for.
type fleetQuery struct {
	Q, Need     string
	All         bool
	Page, NPage int
}

// parseFleetQuery reads the fleet page's query. A need it does not know
// is left out (badNeed answers it first); a page or all that is no value
// of its kind is a paramError, which badFleetQuery answers 400 (a fresh
// user's finding V6: ?page=abc, ?page=-1 and ?all=maybe were ignored). A
// page past the last is no error: page clamps it to the last, and says
// so.
func parseFleetQuery(v url.Values) (fleetQuery, error) {
	q := fleetQuery{Q: strings.TrimSpace(v.Get("q")), Need: v.Get("need"), Page: 1, NPage: 1}
	if !knownNeed(q.Need) {
		q.Need = ""
	}
	if s := v.Get("all"); s != "" {
		all, err := strconv.ParseBool(s)
		if err != nil {
			return q, &paramError{Param: "all", Msg: fmt.Sprintf("all: %q is neither 1 (retired nodes too) nor 0", s)}
		}
		q.All = all
	}
	for _, pp := range []struct {
		param, what string
		n           *int
	}{{"page", "the nodes needing an operator", &q.Page}, {"npage", "every node", &q.NPage}} {
		s := v.Get(pp.param)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return q, &paramError{Param: pp.param, Msg: fmt.Sprintf("%s: %q is not a page number (1, 2, …; ?%s=N pages %s)", pp.param, s, pp.param, pp.what)}
		}
		*pp.n = n
	}
	return q, nil
}

// paramError is a query parameter of the fleet page that is no value of
// its kind: Msg says so, quoting only what the request said.
type paramError struct{ Param, Msg string }

func (e *paramError) Error() string { return e.Msg }

// knownNeed reports whether need is one the fleet page filters on: a
// need of audit.FleetNeeds, or audit.NeedNothing (the nodes needing
// nothing), as the summary names them.
func knownNeed(need string) bool {
	return need == audit.NeedNothing || slices.Contains(audit.FleetNeeds, need)
}

// url is the fleet page (path "/") or its live stream ("/events") asked
// for q.
func (q fleetQuery) url(path string) string {
	v := url.Values{}
	if q.Q != "" {
		v.Set("q", q.Q)
	}
	if q.Need != "" {
		v.Set("need", q.Need)
	}
	if q.All {
		v.Set("all", "1")
	}
	if q.Page > 1 {
		v.Set("page", strconv.Itoa(q.Page))
	}
	if q.NPage > 1 {
		v.Set("npage", strconv.Itoa(q.NPage))
	}
	if e := v.Encode(); e != "" {
		return path + "?" + e
	}
	return path
}

// matches reports whether row r is found by the search q: a part of its
// name or of one of its needs ("stale" finds stale-have), in any case,
// and has the need chosen (audit.NeedNothing: none, as the summary
// counts the calm nodes).
func (q fleetQuery) matches(r *audit.FleetRow) bool {
	switch q.Need {
	case "":
	case audit.NeedNothing:
		if len(r.Attention) > 0 {
			return false
		}
	default:
		if !slices.Contains(r.Attention, q.Need) {
			return false
		}
	}
	if q.Q == "" {
		return true
	}
	s := strings.ToLower(q.Q)
	if strings.Contains(r.Node, s) {
		return true
	}
	for _, a := range r.Attention {
		if strings.Contains(a, s) {
			return true
		}
	}
	return false
}

// fleetIndex is every row of the fleet at one time, made once and shared
// by every page and live stream asking until the fleet changes or a
// second passes (at 100,000 nodes, making and sorting the rows takes a
// few hundred ms: it was done for each page and each frame).
type fleetIndex struct {
	gen uint64
	at  time.Time
	// copied is when its input was copied, built when it was made (the
	// wall clock: at is the console's clock when its input was copied).
	copied, built time.Time
	// loaded, unread and noSnaps are the fleet's when its input was
	// copied.
	loaded  bool
	unread  error
	noSnaps bool
	// silence is the stream's silence when its input was copied.
	silence silence
	// byName is every row, by node name; pressing the rows needing an
	// operator, most pressing first (audit.SortFleet), retired ones too.
	byName, pressing []audit.FleetRow
	// summary and calm count the non-retired rows; summaryAll and
	// calmAll every row.
	summary, summaryAll []audit.NeedCount
	calm, calmAll       int
	retired             int
	// behind counts the rows older than their nodes' events that no
	// reconciler answered for, since unansweredSince; noneSince is
	// when no reconciler answered any node (zero: one did).
	behind                     int
	unansweredSince, noneSince time.Time
}

// index returns the rows at now; f.mu is held. The first index is made
// at once; after that, one older than the fleet's last change, or a
// second or more from now, is still returned while a newer one is made
// in the background from a copy of the views (at 100,000 nodes making
// one takes about a second of CPU, many more on a loaded machine: a page
// does not wait for it, and the fleet's lock is not held meanwhile),
// unless its copy is indexMaxAge or more old: then wait is closed once
// the newer one is in, and the page is made of that (f.idx). Indexes are
// made at most once per indexEvery of wall time; once a newer one is in,
// the pages are told when the fleet changed, and their live streams send
// it.
func (f *fleet) index(now time.Time, stale time.Duration) (x *fleetIndex, wait <-chan struct{}) {
	x = f.idx
	if x == nil {
		x = f.indexInput(now).make(stale)
		x.built = f.wall()
		f.idx = x
		return x, nil
	}
	if x.gen == f.gen && now.Sub(x.at).Abs() < time.Second {
		return x, nil
	}
	if f.building {
		return x, f.tooOld(x)
	}
	if wait := indexEvery - f.wall().Sub(x.built); wait > 0 {
		if x.gen != f.gen && !f.later {
			f.later = true
			time.AfterFunc(wait, func() {
				f.mu.Lock()
				f.later = false
				f.notify()
				f.mu.Unlock()
			})
		}
		return x, nil
	}
	f.building = true
	made := make(chan struct{})
	f.made = made
	in := f.indexInput(now)
	go func() {
		nx := in.make(stale)
		nx.built = f.wall()
		f.mu.Lock()
		defer f.mu.Unlock()
		f.building = false
		f.idx = nx
		close(made)
		if nx.gen != x.gen {
			f.notify()
		}
	}()
	return x, f.tooOld(x)
}

// tooOld returns, when x's copy is indexMaxAge or more old, the channel
// closed once the index being made is in (nil: x may be shown); f.mu is
// held and an index is being made.
func (f *fleet) tooOld(x *fleetIndex) <-chan struct{} {
	if f.wall().Sub(x.copied) < indexMaxAge {
		return nil
	}
	return f.made
}

// silence is a stream that does not answer: why (empty: it answers),
// since when, and the newest event seen before.
type silence struct {
	why     string
	since   time.Time
	lastSeq uint64
	lastAt  time.Time
	// store is serve's store's status (store.StoreStatus.Headline).
	store store.StoreStatus
}

// streamPoll is how often the console asks whether the stream answers
// (watchStream).
const streamPoll = 2 * time.Second

// watchStream asks chk whether the stream answers every streamPoll until
// ctx is done, and keeps the answer for the fleet page (fleetPage.Silent):
// a console whose stream lost its leader showed its last view as the
// fleet now, "Nothing needs an operator" with the request's time (a fresh
// user's finding, M2). The first silence and the answer again are logged.
func (f *fleet) watchStream(ctx context.Context, chk StreamChecker) {
	t := time.NewTicker(streamPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		asked := f.wall()
		err := chk.StreamAnswers(ctx)
		if ctx.Err() != nil {
			return
		}
		var st store.StoreStatus
		if sc, ok := chk.(StoreChecker); ok && err == nil {
			st, _ = sc.StoreStatus(ctx) // no answer: nothing known
		}
		f.mu.Lock()
		if st.Stores != f.store.Stores || st.Watched != f.store.Watched || !slices.Equal(st.Refusing, f.store.Refusing) {
			if st.Watched && !st.Stores {
				f.log.Warn("console: serve's store takes no write: the fleet page opens with it", "since", st.Since, "why", st.Why)
			}
			f.store = st
			f.changed()
		}
		switch was := f.silent; {
		case err != nil && was == nil:
			f.silent, f.silentSince = err, asked
			f.changed()
			f.log.Warn("console: the stream does not answer: the fleet page says its view is as of the last event seen", "err", err, "last_seq", f.lastSeq)
		case err != nil:
			f.silent = err
		case was != nil:
			f.log.Info("console: the stream answers again", "after", f.wall().Sub(f.silentSince).Round(time.Second))
			f.silent, f.silentSince = nil, time.Time{}
			f.changed()
		}
		f.mu.Unlock()
	}
}

// indexInput is what an index is made of, copied under f.mu: the views
// are replaced, never changed, so a copy of the map's entries is enough;
// a node's warnings are appended to and sorted in place, so they are
// copied; the fill reports are replaced whole.
type indexInput struct {
	gen      uint64
	now      time.Time
	copied   time.Time
	loaded   bool
	unread   error
	noSnaps  bool
	silence  silence
	views    []NodeView
	warnings map[string][]uint64
	sources  map[string][]audit.SourceProblem
	// behind maps each node no reconciler answered for (fleet.unanswered)
	// whose view is older than its events to its newest event's
	// sequence; unansweredSince is the oldest of their asks, noneSince
	// the fleet's.
	behind          map[string]uint64
	unansweredSince time.Time
	noneSince       time.Time
}

// indexInput copies what an index is made of; f.mu is held.
func (f *fleet) indexInput(now time.Time) *indexInput {
	in := &indexInput{gen: f.gen, now: now, copied: f.wall(), loaded: f.loaded, unread: f.unread, noSnaps: f.noSnapshots, views: make([]NodeView, 0, len(f.views)),
		silence:  silence{since: f.silentSince, lastSeq: f.lastSeq, lastAt: f.lastAt, store: f.store},
		warnings: make(map[string][]uint64, len(f.warnings)), sources: f.sources}
	if f.silent != nil {
		in.silence.why = f.silent.Error()
	}
	for _, nv := range f.views {
		in.views = append(in.views, nv)
	}
	for n, ws := range f.warnings {
		in.warnings[n] = slices.Clone(ws)
	}
	in.noneSince = f.noneSince
	for n, at := range f.unanswered {
		seq := f.dirty[n]
		if nv, ok := f.views[n]; seq == 0 || ok && nv.View.Seq >= seq {
			continue
		}
		if in.behind == nil {
			in.behind = map[string]uint64{}
		}
		in.behind[n] = seq
		if in.unansweredSince.IsZero() || at.Before(in.unansweredSince) {
			in.unansweredSince = at
		}
	}
	return in
}

// make makes the index.
func (in *indexInput) make(stale time.Duration) *fleetIndex {
	slices.SortFunc(in.views, func(a, b NodeView) int { return strings.Compare(a.Node, b.Node) })
	x := &fleetIndex{gen: in.gen, at: in.now, copied: in.copied, loaded: in.loaded, unread: in.unread, noSnaps: in.noSnaps, silence: in.silence, byName: make([]audit.FleetRow, 0, len(in.views)),
		unansweredSince: in.unansweredSince, noneSince: in.noneSince}
	for _, nv := range in.views {
		r := nv.Row(in.now, stale)
		if nv.Err == nil {
			r.SetWarningSeqs(in.warnings[nv.Node])
			if ps := in.sources[nv.Node]; len(ps) > 0 {
				r.SetSources(ps)
			}
			// Older than the node's events, no reconciler having
			// folded them: said on the row, and no stale-have blamed
			// on it (a fresh user's findings M9 and m1).
			if seq, ok := in.behind[nv.Node]; ok {
				r.SetNewest(seq)
				x.behind++
			}
		}
		x.byName = append(x.byName, r)
		if len(r.Attention) > 0 {
			x.pressing = append(x.pressing, r)
		}
	}
	audit.SortFleet(x.pressing)
	live := make([]audit.FleetRow, 0, len(x.byName))
	for _, r := range x.byName {
		if r.Retired {
			x.retired++
		} else {
			live = append(live, r)
		}
	}
	x.summary, x.calm = audit.CountNeeds(live)
	x.summaryAll, x.calmAll = audit.CountNeeds(x.byName)
	x.built = in.copied
	return x
}

// page returns the fleet page asked for by q at now; retired nodes only
// with q.All (they leave the fleet, DESIGN.md §9).
func (f *fleet) page(q fleetQuery, now time.Time, stale time.Duration) fleetPage {
	f.mu.Lock()
	x, wait := f.index(now, stale)
	f.mu.Unlock()
	if wait != nil {
		<-wait
		f.mu.Lock()
		x = f.idx
		f.mu.Unlock()
	}
	p := fleetPage{Query: q.Q, Need: q.Need, All: q.All, Gen: x.gen, Nodes: len(x.byName), Now: x.at, Live: q.url("/events"), NoSnapshots: x.noSnaps,
		Behind: x.behind, UnansweredSince: x.unansweredSince, NoReconciler: x.noneSince}
	if x.silence.why != "" {
		p.Silent, p.SilentSince, p.LastSeq, p.LastAt = x.silence.why, x.silence.since, x.silence.lastSeq, x.silence.lastAt
	}
	p.StoreFull = x.silence.store.Headline(x.at)
	switch {
	case x.unread != nil:
		p.Unread = fmt.Sprintf("the fleet could not be read: %v. Nothing is shown rather than a fleet that may be wrong; see the console's log.", x.unread)
		return p
	case !x.loaded:
		p.Loading = true
		return p
	}
	p.Summary = groups(x.summary, x.calm, q)
	if q.All {
		p.Summary = groups(x.summaryAll, x.calmAll, q)
	} else {
		p.RetiredOut = x.retired
	}
	// One pass over each list: count what matches, keep the page's rows;
	// a page past the last (?page=99) is clamped to the last, and a
	// second pass keeps its rows.
	keep := func(list []audit.FleetRow, page *int) (rows []audit.FleetRow, first, total int) {
		for {
			from := (*page - 1) * MaxRows
			rows, total = nil, 0
			for i := range list {
				r := &list[i]
				if r.Retired && !q.All || !q.matches(r) {
					continue
				}
				if total >= from && len(rows) < MaxRows {
					rows = append(rows, *r)
				}
				total++
			}
			if last := max(1, (total+MaxRows-1)/MaxRows); *page > last {
				*page = last
				continue
			}
			return rows, from, total
		}
	}
	asked := q
	p.Rows, p.RowsFirst, p.Matching = keep(x.byName, &q.NPage)
	p.More = max(0, p.Matching-p.RowsFirst-len(p.Rows))
	p.Needs, p.NeedsFirst, p.NeedsTotal = keep(x.pressing, &q.Page)
	// A page past the last (an old link to a fleet that shrank since, or
	// a number typed) shows the last, saying so: the user wanted the end
	// of the list, not an error.
	if asked.Page != q.Page {
		p.Clamped = append(p.Clamped, fmt.Sprintf("page %d of the nodes needing an operator is past the last: showing page %d, the last", asked.Page, q.Page))
	}
	if asked.NPage != q.NPage {
		p.Clamped = append(p.Clamped, fmt.Sprintf("page %d of every node is past the last: showing page %d, the last", asked.NPage, q.NPage))
	}
	p.NeedsMore = max(0, p.NeedsTotal-p.NeedsFirst-len(p.Needs))
	p.Live = q.url("/events") // of the page shown, clamped
	p.NeedsPager = pages(q, q.Page, p.NeedsTotal, func(q *fleetQuery, n int) { q.Page = n })
	p.RowsPager = pages(q, q.NPage, p.Matching, func(q *fleetQuery, n int) { q.NPage = n })
	return p
}

// groups makes the summary's links: each need's link shows the nodes
// with it, the last (calm nodes needing nothing) those with none (the
// search kept, from the first page). Every link is one parseFleetQuery
// and badNeed take (a fresh user's finding L5: "nothing" was no link,
// and ?need=nothing answered 400).
func groups(counts []audit.NeedCount, calm int, q fleetQuery) []needGroup {
	out := make([]needGroup, 0, len(counts)+1)
	group := func(need string, nodes int) needGroup {
		qq := q
		qq.Need, qq.Page, qq.NPage = need, 1, 1
		if q.Need == need {
			qq.Need = "" // a second click shows every node again
		}
		return needGroup{Need: need, Nodes: nodes, Href: qq.url("/"), Chosen: q.Need == need}
	}
	for _, c := range counts {
		out = append(out, group(c.Need, c.Nodes))
	}
	g := group(audit.NeedNothing, calm)
	g.Calm = true
	return append(out, g)
}

// pages links the pages before and after page of a table of total rows.
func pages(q fleetQuery, page, total int, set func(*fleetQuery, int)) pager {
	pg := pager{Page: page, Of: max(1, (total+MaxRows-1)/MaxRows)}
	if page > 1 {
		qq := q
		set(&qq, min(page-1, pg.Of))
		pg.Prev = qq.url("/")
	}
	if page < pg.Of {
		qq := q
		set(&qq, page+1)
		pg.Next = qq.url("/")
	}
	return pg
}

// lastSeen returns the newest sequence of node seen on the stream since
// the console started following (0: none).
func (f *fleet) lastSeen(node string) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last[node]
}

// SourcesEvery is how often the console reads the provisioners' reports
// of unfilled files (a KV bucket, not the stream it follows).
const SourcesEvery = time.Second

// KnocksEvery is how often the console reads, beside the reports, which
// knocks no provisioner answered (and at once when a node's newest knock
// changed): a node whose newest knock its
// provisioner's answer does not cover has its knock read (a get each, at
// most 200), and past 200 knocked nodes every answer is read in one pass,
// so not every second (a knock is unanswered only after
// audit.KnockGrace, 10 s, anyway).
const KnocksEvery = 5 * time.Second

// pollSources reads the provisioners' reports every SourcesEvery, and the
// knocks no provisioner answered (Source.Unanswered, of the nodes whose
// view names a knock) every KnocksEvery, until ctx is done, and tells the
// pages when they changed: a knock nobody answered is a source problem
// of its node, as `fleet` shows it (a fresh user's finding 2: the fleet
// page said "Nothing needs an operator").
func (f *fleet) pollSources(ctx context.Context, now func() time.Time) {
	t := time.NewTicker(SourcesEvery)
	defer t.Stop()
	var (
		unanswered map[string]audit.SourceProblem
		knocked    map[string]uint64
		knocksAt   time.Time
	)
	for {
		// Read again every KnocksEvery, and at once when a node's newest
		// knock changed (or the fleet was loaded).
		if k, at := f.knocked(), time.Now(); at.Sub(knocksAt) >= KnocksEvery || !maps.Equal(k, knocked) {
			knocked, knocksAt = k, at
			un, err := f.src.Unanswered(ctx, k, now())
			if err == nil {
				unanswered = un
			} else if ctx.Err() == nil {
				f.log.Debug("console: unanswered knocks", "err", err)
			}
		}
		ps, err := f.src.Sources(ctx, "")
		if err == nil && len(unanswered) > 0 {
			merged := make(map[string][]audit.SourceProblem, len(ps)+len(unanswered))
			maps.Copy(merged, ps)
			for n, p := range unanswered {
				merged[n] = audit.AddUnanswered(merged[n], p)
			}
			ps = merged
		}
		if err == nil {
			f.mu.Lock()
			if !reflect.DeepEqual(ps, f.sources) && !(len(ps) == 0 && len(f.sources) == 0) {
				f.sources = ps
				f.changed()
			}
			f.mu.Unlock()
		} else if ctx.Err() == nil {
			f.log.Debug("console: fill statuses", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// knocked returns each node whose view names a knock (not retired, read
// without an error) with its newest knock's cause.
func (f *fleet) knocked() map[string]uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]uint64{}
	for n, nv := range f.views {
		if nv.Err == nil && nv.View.LastKnock != nil && nv.View.LastKnock.Cause > 0 && (nv.View.Retire == nil || !nv.View.Retire.Retired) {
			out[n] = nv.View.LastKnock.Cause
		}
	}
	return out
}
