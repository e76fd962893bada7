package console

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// DefaultListen is where the console listens unless told otherwise:
// loopback only.
const DefaultListen = "127.0.0.1:7070"

// Config configures a [Console].
type Config struct {
	// Source is where everything shown is read.
	Source Source
	// Logger gets the console's warnings (nil: discarded).
	Logger *slog.Logger
	// Stale is the age past which a have is stale (0: 10 min, as `meshfold
	// fleet`).
	Stale time.Duration
	// Warnings is how far back journal warnings are counted at start (0:
	// 1 h, as `meshfold fleet`; negative: not counted).
	Warnings time.Duration
	// Window is how many events the node page draws by default (0: 300).
	Window int
	// Now is the clock (nil: time.Now); ages on the pages are told
	// against it.
	Now func() time.Time
}

// MaxMarks is the most events one picture draws; a wider range shows
// its newest MaxMarks events and says so.
const MaxMarks = 2000

// Console is the read-only web console: an http.Handler serving the fleet
// page, the node pages and the live updates. Every route is a GET.
type Console struct {
	cfg   Config
	log   *slog.Logger
	fleet *fleet
	// loaded is closed once Run has loaded the fleet ([Console.Loaded]).
	loaded chan struct{}
	tmpl   *template.Template
	mux    *http.ServeMux
}

// New returns a console reading cfg.Source. Call [Console.Run] to load
// the fleet and follow the stream; until it has, the fleet page says the
// fleet is loading (503), and if loading fails, that it could not be
// read and why.
func New(cfg Config) (*Console, error) {
	if cfg.Source == nil {
		return nil, errors.New("console: no source")
	}
	if cfg.Stale == 0 {
		cfg.Stale = 10 * time.Minute
	}
	if cfg.Warnings == 0 {
		cfg.Warnings = time.Hour
	}
	if cfg.Window <= 0 {
		cfg.Window = 300
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("console: templates: %w", err)
	}
	c := &Console{cfg: cfg, log: log, fleet: newFleet(cfg.Source, log), loaded: make(chan struct{}), tmpl: t, mux: http.NewServeMux()}
	static, _ := fs.Sub(staticFS, "static")
	c.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	c.mux.HandleFunc("GET /{$}", c.fleetPage)
	c.mux.HandleFunc("GET /events", c.fleetEvents)
	c.mux.HandleFunc("GET /node/{node}", c.nodePage)
	c.mux.HandleFunc("GET /node/{node}/events", c.nodeEvents)
	c.mux.HandleFunc("GET /rollouts", c.rolloutsPage)
	c.mux.HandleFunc("GET /rollouts/{fleet}", c.rolloutPage)
	c.mux.HandleFunc("GET /", c.notFound) // any other path: the house's 404, not net/http's
	return c, nil
}

// ServeHTTP serves the console. Anything but GET and HEAD is refused with
// 405: the console changes nothing.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "the console is read-only", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "no-referrer")
	c.mux.ServeHTTP(w, r)
}

// Run follows the stream from now on, then loads the fleet from the
// snapshots, and keeps the fleet's views fresh until ctx is done. No
// event between the load and the follow is missed: before the load it
// reads up to which event the snapshots cover each partition
// (Source.Lag), and once the follow has started, the stream's newest
// events; the nodes with events between the two whose loaded view is
// older (query.LaggingNodes, as `meshfold fleet`'s table reads them) are
// read live from the reconciler, like the nodes of new events (a fresh
// user's finding F3: after a serve's kill -9 the fleet page showed a
// node's old want and plan until its next event).
//
// Errors: the source's, when loading or following fails.
func (c *Console) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	followed := make(chan error, 1)
	started := make(chan struct{})
	go func() { followed <- c.cfg.Source.Follow(ctx, sync.OnceFunc(func() { close(started) }), c.fleet.saw) }()
	go c.fleet.refresh(ctx)
	go c.fleet.pollSources(ctx, c.cfg.Now)
	var since time.Time
	if c.cfg.Warnings > 0 {
		since = c.cfg.Now().Add(-c.cfg.Warnings)
	}
	// The checkpoints before the load: the snapshots loaded cover at
	// least as much.
	lag, lagErr := c.cfg.Source.Lag(ctx)
	noSnapshots, err := c.fleet.load(ctx, since)
	if err != nil {
		return err
	}
	select {
	case <-started:
	case <-ctx.Done():
		return nil
	case err := <-followed:
		return err
	}
	// The newest events once the follow has started: it delivers every
	// later one.
	if lagErr == nil {
		var now query.SnapshotLag
		if now, lagErr = c.cfg.Source.Lag(ctx); lagErr == nil {
			lag, lagErr = lag.Through(now)
		}
	}
	switch {
	case lagErr == nil:
		c.fleet.catchUp(ctx, lag)
	case errors.Is(lagErr, query.ErrNoSnapshots):
		noSnapshots = true
	case ctx.Err() == nil:
		c.log.Warn("console: how far the snapshots lag the stream could not be read; rows of nodes with events past them may be older than those events until their next one", "err", lagErr)
	}
	close(c.loaded)
	if chk, ok := c.cfg.Source.(StreamChecker); ok {
		go c.fleet.watchStream(ctx, chk)
	}
	if noSnapshots {
		c.log.Warn("console: no reconciler has checkpointed the stream yet: the fleet page shows only the nodes folded since the console started, and loads the whole fleet once one has")
		go c.awaitSnapshots(ctx, since)
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-followed:
		return err
	}
}

// snapshotsPoll is how often a console that found no snapshot bucket
// looks for it again (awaitSnapshots).
const snapshotsPoll = 2 * time.Second

// awaitSnapshots loads the fleet again, as Run does, once a reconciler
// has checkpointed the stream: Run found no snapshot bucket, loaded an
// empty fleet and only follows what is stored since. Before, a console
// started ahead of the reconciler's first checkpoint never showed the
// nodes with no event after its start (a fresh user's finding, M7's
// edge), and said "Nothing needs an operator" of them. It looks every
// snapshotsPoll until the load finds the bucket or ctx is done.
func (c *Console) awaitSnapshots(ctx context.Context, since time.Time) {
	t := time.NewTimer(snapshotsPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// As Run: the checkpoints before the load, the stream's newest
		// events after it; the follow has long started.
		lag, err := c.cfg.Source.Lag(ctx)
		if err == nil {
			var noSnapshots bool
			if noSnapshots, err = c.fleet.load(ctx, since); err == nil && !noSnapshots {
				var now query.SnapshotLag
				if now, err = c.cfg.Source.Lag(ctx); err == nil {
					lag, err = lag.Through(now)
				}
				if err == nil {
					c.fleet.catchUp(ctx, lag)
				} else if ctx.Err() == nil {
					c.log.Warn("console: how far the snapshots lag the stream could not be read; rows of nodes with events past them may be older than those events until their next one", "err", err)
				}
				c.log.Info("console: a reconciler has checkpointed the stream: the whole fleet is loaded")
				return
			}
		}
		if err != nil && !errors.Is(err, query.ErrNoSnapshots) && ctx.Err() == nil {
			c.log.Warn("console: looking for the reconciler's snapshots failed; trying again", "err", err, "in", snapshotsPoll)
		}
		t.Reset(snapshotsPoll)
	}
}

// Loaded is closed once [Console.Run] has loaded the fleet, follows the
// stream and has read which nodes the snapshots lag: a reader whose
// credentials may not read what the console reads has been refused by
// then (meshfold console ends on it, naming the role it needs).
func (c *Console) Loaded() <-chan struct{} { return c.loaded }

// Serve serves the console on ln until ctx is done.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
		_ = hs.Close()
	}()
	if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// IsLoopback reports whether addr (HOST:PORT) listens on loopback only.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (c *Console) render(w http.ResponseWriter, name string, data any) {
	c.renderStatus(w, http.StatusOK, name, data)
}

// renderStatus is render answering status.
func (c *Console) renderStatus(w http.ResponseWriter, status int, name string, data any) {
	var b bytes.Buffer
	if err := c.tmpl.ExecuteTemplate(&b, name, data); err != nil {
		c.log.Error("console: render", "template", name, "err", err)
		http.Error(w, "render: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// errorView is the house error page (error.html): a title, what is wrong,
// and, for a query value that is not one, the valid values, each a link
// (Base followed by the value); Back is the page to go back to (the same
// page without what was wrong), named BackText.
type errorView struct {
	Title, Error   string
	Lines          []string // shown under the error, one each: events, not prose
	Valid          []string
	Base           string
	Back, BackText string
}

// badRequest answers 400 with the house error page: the console's
// header, title, what is wrong and a way back (back, named backText),
// never net/http's bare text (a fresh user's finding). msg names only
// what the request said: never a file's content.
func (c *Console) badRequest(w http.ResponseWriter, title, msg, back, backText string) {
	c.renderStatus(w, http.StatusBadRequest, "error.html", errorView{Title: title, Error: msg, Back: back, BackText: backText})
}

// notFound answers a path the console has no page for with the house
// error page, 404.
func (c *Console) notFound(w http.ResponseWriter, r *http.Request) {
	c.renderStatus(w, http.StatusNotFound, "error.html", errorView{Title: "Not found",
		Error: fmt.Sprintf("the console has no page %s: its pages are the fleet (/), a node (/node/NAME) and the rollouts (/rollouts, /rollouts/FLEET)", r.URL.Path)})
}

// badNeed answers a fleet page asked for a need that is none of
// audit.FleetNeeds nor audit.NeedNothing: 400, the valid values listed,
// each a link. ok is false when it answered.
func (c *Console) badNeed(w http.ResponseWriter, r *http.Request) (ok bool) {
	need := r.URL.Query().Get("need")
	if need == "" || knownNeed(need) {
		return true
	}
	valid := append(slices.Clip(audit.FleetNeeds), audit.NeedNothing)
	msg := fmt.Sprintf("need %q is no need the fleet names: one of %s", need, strings.Join(valid, ", "))
	c.renderStatus(w, http.StatusBadRequest, "error.html", errorView{Title: "No such need", Error: msg, Valid: valid, Base: "/?need=",
		Back: "/", BackText: "the whole fleet"})
	return false
}

// fleetQuery returns the fleet page's query of r; ok false when it
// answered 400 instead: a need that is none (badNeed), or a page or all
// that is no value of its kind, with a way back to the same page without
// it.
func (c *Console) fleetQuery(w http.ResponseWriter, r *http.Request) (q fleetQuery, ok bool) {
	if !c.badNeed(w, r) {
		return q, false
	}
	q, err := parseFleetQuery(r.URL.Query())
	var pe *paramError
	if errors.As(err, &pe) {
		v := r.URL.Query()
		v.Del(pe.Param)
		back := "/"
		if e := v.Encode(); e != "" {
			back += "?" + e
		}
		c.badRequest(w, "Bad request", pe.Msg, back, "the fleet page without ?"+pe.Param)
		return q, false
	}
	return q, true
}

func (c *Console) fleetPage(w http.ResponseWriter, r *http.Request) {
	q, ok := c.fleetQuery(w, r)
	if !ok {
		return
	}
	p := c.fleet.page(q, c.cfg.Now(), c.cfg.Stale)
	if p.Loading || p.Unread != "" {
		// No fleet was read: not a page a monitor or a script may take
		// for an answer (a fresh user's finding M7).
		w.Header().Set("Retry-After", "2")
		c.renderStatus(w, http.StatusServiceUnavailable, "fleet.html", p)
		return
	}
	c.render(w, "fleet.html", p)
}

// keepAlive is how often the live stream sends a comment, and re-renders
// the fleet so that ages and stale haves move without an event.
const keepAlive = 10 * time.Second

// minFrameGap is the least time between two frames of the live stream.
const minFrameGap = time.Second

// fleetEvents streams the fleet page asked for (the page's search, need
// and pages) as server-sent events: an event "fleet" whose data is the
// HTML of the fleet's sections, on a change, at most one a second
// (minFrameGap: changes in between are coalesced into the next frame),
// and every keepAlive. The rows come from the fleet's shared index,
// made at most once a second however many pages are open.
func (c *Console) fleetEvents(w http.ResponseWriter, r *http.Request) {
	q, ok := c.fleetQuery(w, r)
	if !ok {
		return
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	ch, cancel := c.fleet.subscribe()
	defer cancel()
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	var last uint64
	var sent time.Time
	send := func(force bool) bool {
		p := c.fleet.page(q, c.cfg.Now(), c.cfg.Stale)
		if p.Gen == last && !force {
			return true
		}
		last = p.Gen
		var b bytes.Buffer
		if err := c.tmpl.ExecuteTemplate(&b, "fleet-body", p); err != nil {
			c.log.Error("console: render", "template", "fleet-body", "err", err)
			return false
		}
		var out strings.Builder
		fmt.Fprintf(&out, "event: fleet\nid: %d\n", p.Gen)
		for _, line := range strings.Split(b.String(), "\n") {
			out.WriteString("data: " + line + "\n")
		}
		out.WriteString("\n")
		if _, err := w.Write([]byte(out.String())); err != nil {
			return false
		}
		fl.Flush()
		sent = time.Now()
		return true
	}
	// A first frame at once: the page may have been rendered before a
	// change this stream would otherwise never report.
	if !send(true) {
		return
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-ch:
			// At most one frame a second: a busy fleet changes more often
			// than a page needs to be redrawn.
			if wait := time.Until(sent.Add(minFrameGap)); wait > 0 {
				select {
				case <-r.Context().Done():
					return
				case <-time.After(wait):
				}
			}
			if !send(false) {
				return
			}
		case <-tick.C:
			if !send(true) {
				return
			}
		}
	}
}

// nodeEvents tells an open node page, as server-sent events ("node",
// data: the newest sequence), that the node has events newer than the
// page's last (?after=SEQ). The page offers a reload; it redraws nothing
// by itself, so a picture being read does not move.
func (c *Console) nodeEvents(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	node := r.PathValue("node")
	after, err := strconv.ParseUint(r.URL.Query().Get("after"), 10, 64)
	switch {
	case !ok:
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	case !events.ValidName(node):
		c.badRequest(w, "No such node", fmt.Sprintf("node %q: %v", node, events.ErrBadName), "/", "the fleet")
		return
	case err != nil:
		c.badRequest(w, "Bad request", fmt.Sprintf("after: %q is not a stream sequence (1, 2, …): the live stream of a node page is /node/NAME/events?after=SEQ", r.URL.Query().Get("after")),
			"/node/"+url.PathEscape(node), "node "+node)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	ch, cancel := c.fleet.subscribe()
	defer cancel()
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	if _, err := io.WriteString(w, ": follows "+node+"\n\n"); err != nil {
		return
	}
	fl.Flush()
	sent := after
	offer := func() error {
		if last := c.fleet.lastSeen(node); last > sent {
			sent = last
			if _, err := fmt.Fprintf(w, "event: node\nid: %d\ndata: %d\n\n", last, last); err != nil {
				return err
			}
			fl.Flush()
		}
		return nil
	}
	// An event that came between the page's render and this subscription
	// signalled no one: look once now, or the page waits for the next.
	if offer() != nil {
		return
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
			if _, err := io.WriteString(w, ": keep-alive\n\n"); err != nil {
				return
			}
			fl.Flush()
		case <-ch:
			if offer() != nil {
				return
			}
		}
	}
}

// nodeQuery is a node page's parameters.
type nodeQuery struct {
	From, To, AsOf string
	Why            uint64
	ByTime         bool
}

func (q nodeQuery) values() url.Values {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("from", q.From)
	set("to", q.To)
	set("as_of", q.AsOf)
	if q.Why != 0 {
		v.Set("why", strconv.FormatUint(q.Why, 10))
	}
	if q.ByTime {
		v.Set("axis", "time")
	}
	return v
}

func (q nodeQuery) url(node string) string {
	s := "/node/" + url.PathEscape(node)
	if e := q.values().Encode(); e != "" {
		s += "?" + e
	}
	return s
}

// nodeView is what the node page shows.
type nodeView struct {
	Node    string
	Events  int
	Query   nodeQuery
	Error   string
	Notes   []string
	Picture picture
	// From and To are the window's first and last sequences.
	From, To uint64
	Shown    int
	Entries  []entryView
	Why      *whyView
	// AsOf is the state as of the bound (audit --as-of), when asked.
	AsOf *audit.AsOf
	// StateText is `meshfold state`'s text: the live state, or the fold
	// of the history when no reconciler answers; Source says which.
	StateText   string
	Composition reconcile.Composition
	Source      string
	Links       zoomLinks
	AxisTime    bool
	// Live is the event stream telling the page of newer events, when
	// the page shows the node as it is now.
	Live string
}

type entryView struct {
	audit.Entry
	Href      string
	CauseHref string
	Chosen    bool
}

type zoomLinks struct {
	In, Out, Older, Newer, All, Latest, SeqAxis, TimeAxis, NoWhy, Now string
}

func (c *Console) nodePage(w http.ResponseWriter, r *http.Request) {
	node := r.PathValue("node")
	if !events.ValidName(node) {
		c.badRequest(w, "No such node", fmt.Sprintf("node %q: %v", node, events.ErrBadName), "/", "the fleet")
		return
	}
	qs := r.URL.Query()
	q := nodeQuery{From: qs.Get("from"), To: qs.Get("to"), AsOf: qs.Get("as_of"), ByTime: qs.Get("axis") == "time"}
	// A parameter that is wrong is said on the house page, with a way
	// back to the same page without it.
	without := func(bad string) string {
		qq := q
		switch bad {
		case "from":
			qq.From = ""
		case "to":
			qq.To = ""
		case "as_of":
			qq.AsOf = ""
		}
		return qq.url(node)
	}
	// An axis the page does not draw is refused as the other bad
	// parameters are, naming the two it draws: a fresh user's
	// ?axis=banana was drawn by sequence without a word.
	if ax := qs.Get("axis"); ax != "" && ax != "seq" && ax != "time" {
		c.badRequest(w, "Bad request", fmt.Sprintf("axis: %q is no axis: want seq (the default) or time", ax), without("axis"), "node "+node)
		return
	}
	if s := qs.Get("why"); s != "" {
		n, err := strconv.ParseUint(strings.TrimPrefix(s, "#"), 10, 64)
		if err != nil || n == 0 {
			c.badRequest(w, "Bad request", fmt.Sprintf("why: %q is not a stream sequence (1, 2, …)", s), without("why"), "node "+node)
			return
		}
		q.Why = n
	}
	parse := func(name, s string) (*audit.Bound, bool) {
		if s == "" {
			return nil, true
		}
		b, err := audit.ParseBound(s)
		if err != nil {
			c.badRequest(w, "Bad request", name+": "+err.Error(), without(name), "node "+node)
			return nil, false
		}
		return &b, true
	}
	from, ok1 := parse("from", q.From)
	to, ok2 := parse("to", q.To)
	asOf, ok3 := parse("as_of", q.AsOf)
	if !ok1 || !ok2 || !ok3 {
		return
	}
	// A window whose from is after its to holds nothing: said, with the
	// window the other way round, rather than a page of "0 events" (a
	// fresh user's ?from=400&to=300). A sequence and a time are not
	// compared: that needs the stream.
	if from != nil && to != nil && from.IsTime() == to.IsTime() &&
		(!from.IsTime() && from.Seq > to.Seq || from.IsTime() && !from.Time.Before(to.Time.Add(to.Unit))) {
		swapped := q
		swapped.From, swapped.To = q.To, q.From
		c.badRequest(w, "Bad request", fmt.Sprintf("from %s is after to %s: the range is inverted", q.From, q.To),
			swapped.url(node), fmt.Sprintf("from %s to %s", q.To, q.From))
		return
	}
	ctx := r.Context()
	h, err := c.cfg.Source.History(ctx, node, query.Bounds{Until: asOf})
	if err != nil {
		c.renderStatus(w, http.StatusBadGateway, "error.html", errorView{Title: "The stream cannot be read", Error: err.Error(),
			Back: q.url(node), BackText: "try node " + node + " again"})
		return
	}
	if len(h.Events) == 0 && asOf == nil {
		c.renderStatus(w, http.StatusNotFound, "node.html", nodeView{Node: node, Error: fmt.Sprintf("node %s has no events in the stream", node)})
		return
	}
	v := nodeView{Node: node, Events: len(h.Events), Query: q, AxisTime: q.ByTime}
	// The stream may no longer hold the node's first events: said as
	// `meshfold audit` says it.
	v.Notes = appendNote(v.Notes, c.cfg.Source.Begins(ctx, h))
	// The window: [i, j) of the events read.
	i, j := max(0, len(h.Events)-c.cfg.Window), len(h.Events)
	if from != nil || to != nil {
		i, j = 0, len(h.Events)
		if from != nil {
			var n string
			i, n = h.Since(*from)
			v.Notes = appendNote(v.Notes, n)
		}
		if to != nil {
			var n string
			j, n = h.Until(*to)
			v.Notes = appendNote(v.Notes, n)
		}
		j = max(i, j)
	}
	if j-i > MaxMarks {
		v.Notes = append(v.Notes, fmt.Sprintf("the range holds %d events: drawing its newest %d; zoom in to see the rest", j-i, MaxMarks))
		i = j - MaxMarks
	}
	href := func(seq uint64) string {
		qq := q
		qq.Why = seq
		return qq.url(node) + "#why"
	}
	bound := ""
	if asOf != nil {
		bound = asOf.String()
	}
	v.Picture = draw(h, i, j, q.ByTime, q.Why, href, bound)
	v.Shown = j - i
	if j > i {
		v.From, v.To = h.Events[i].Seq, h.Events[j-1].Seq
	}
	for _, e := range h.Timeline(i, j) {
		ev := entryView{Entry: e, Href: href(e.Seq), Chosen: e.Seq == q.Why}
		if e.Cause != 0 {
			ev.CauseHref = href(e.Cause)
		}
		v.Entries = append(v.Entries, ev)
	}
	v.Links = c.zoom(node, h, q, i, j)
	if asOf == nil && len(h.Events) > 0 {
		v.Live = fmt.Sprintf("/node/%s/events?after=%d", url.PathEscape(node), h.Events[len(h.Events)-1].Seq)
	}
	if q.Why != 0 {
		wy, err := h.Why(q.Why)
		if err != nil {
			v.Notes = append(v.Notes, err.Error())
		} else {
			v.Why = newWhyView(wy, href)
		}
	}
	if asOf != nil {
		a := h.AsOf(*asOf)
		v.AsOf = &a
		v.Composition = a.Composition
	} else {
		v.StateText, v.Composition, v.Source = c.state(ctx, h)
	}
	c.render(w, "node.html", v)
}

func appendNote(notes []string, n string) []string {
	if n == "" {
		return notes
	}
	return append(notes, n)
}

// state returns `meshfold state`'s text of the node: the reconciler's
// live state, or, when none answers, the fold of the history just read
// (query.SourceStream). Unlike query.Reader.State it does not try the
// snapshot between the two: the page holds the whole history already,
// and its fold is newer than the last checkpoint.
func (c *Console) state(ctx context.Context, h *audit.History) (string, reconcile.Composition, string) {
	now := c.cfg.Now()
	// Why files are unfilled, as the provisioner reports it (live).
	ps, serr := c.cfg.Source.Sources(ctx, h.Node)
	if serr != nil {
		c.log.Warn("console: fill statuses", "node", h.Node, "err", serr)
	}
	sourcesOf := func(v reconcile.View) string {
		// Reported by a provisioner that is down since: as it last saw them.
		if p := audit.MarkGone(audit.MarkStale(ps[h.Node], v.ProvisionerDown()), v.Missing); len(p) > 0 {
			return audit.SourcesHeader(p) + audit.SourcesText(h.Node, p, now)
		}
		return ""
	}
	v, comp, err := c.cfg.Source.Live(ctx, h.Node)
	if err == nil {
		return audit.StateText(v, comp, now, query.SourceReconciler.Text()) + sourcesOf(v), comp, "live"
	}
	if !errors.Is(err, query.ErrNoReconciler) && !errors.Is(err, query.ErrUnknownNode) {
		c.log.Warn("console: state", "node", h.Node, "err", err)
	}
	st := h.Fold(len(h.Events))
	var view reconcile.View = st.View()
	comp = reconcile.CompositionOf(st)
	return audit.StateText(view, comp, now, query.SourceStream.Text()) + sourcesOf(view), comp, "replay"
}

// zoom makes the window's navigation links.
func (c *Console) zoom(node string, h *audit.History, q nodeQuery, i, j int) zoomLinks {
	n := len(h.Events)
	win := func(a, b int) string {
		a, b = max(0, a), min(n, b)
		qq := q
		qq.Why = 0
		if b <= a {
			b = min(n, a+1)
		}
		if a >= n {
			a = max(0, n-1)
		}
		if q.ByTime {
			qq.From = h.Events[a].Time.UTC().Format(time.RFC3339Nano)
			qq.To = h.Events[b-1].Time.UTC().Format(time.RFC3339Nano)
		} else {
			qq.From = strconv.FormatUint(h.Events[a].Seq, 10)
			qq.To = strconv.FormatUint(h.Events[b-1].Seq, 10)
		}
		return qq.url(node)
	}
	var z zoomLinks
	if n == 0 {
		return z
	}
	w := max(1, j-i)
	mid := (i + j) / 2
	z.In = win(mid-max(1, w/4), mid+max(1, w/4))
	z.Out = win(mid-w, mid+w)
	z.Older = win(i-w/2, j-w/2)
	z.Newer = win(i+w/2, j+w/2)
	all := q
	all.From, all.To, all.Why = strconv.FormatUint(h.Events[0].Seq, 10), strconv.FormatUint(h.Events[n-1].Seq, 10), 0
	z.All = all.url(node)
	latest := q
	latest.From, latest.To, latest.Why = "", "", 0
	z.Latest = latest.url(node)
	seq, tm := q, q
	seq.ByTime, tm.ByTime = false, true
	z.SeqAxis, z.TimeAxis = seq.url(node), tm.url(node)
	nw := q
	nw.Why = 0
	z.NoWhy = nw.url(node)
	now := q
	now.AsOf = ""
	z.Now = now.url(node)
	return z
}

var funcs = template.FuncMap{
	"age": func(seconds float64) string {
		if seconds < 0 {
			return "none"
		}
		return audit.Age(time.Duration(seconds * float64(time.Second)))
	},
	"seq": func(s uint64) string {
		if s == 0 {
			return "-"
		}
		return "#" + strconv.FormatUint(s, 10)
	},
	"time": audit.FormatTime,
	"nodeURL": func(node string) string {
		return "/node/" + url.PathEscape(node)
	},
	"f1":  func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
	"add": func(a, b int) int { return a + b },
	// stuck is what `meshfold fleet` prints after its table for a row:
	// its missing files too (the page said a file's source problem with
	// no word of the node's report that it is gone: a fresh user's
	// finding M6).
	"stuck": func(r audit.FleetRow) string {
		rows := []audit.FleetRow{r}
		return audit.FleetNoisyText(rows) + audit.FleetMissingText(rows) + audit.FleetStuckText(rows) + audit.FleetSourcesText(rows, time.Now())
	},
	// acked is what `meshfold fleet` prints of the acknowledged journal
	// warnings: apart from what needs an operator.
	"acked": audit.FleetAckedText,
	"join":  strings.Join,
	"orNone": func(s string) string {
		if s == "" {
			return "(none)"
		}
		return s
	},
}
