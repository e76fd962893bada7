package embedded

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/meshfold/meshfold/store"
)

// What nats-server v2.15 does when its data directory fills up (read in
// its source: jetstream.go, stream.go, disk_avail.go), and why the
// embedded server watches its storage:
//
//   - With no max_file_store configured (serve configures none), the
//     server's storage limit is set once, at start: 75 % of the free
//     space of the store's filesystem, plus 75 % of what the store held
//     (dynJetStreamConfig, finalizeDynamicMaxStore). Once the store uses
//     more than that, every write is refused with 503 err_code 10023
//     "insufficient resources" and the server logs "JetStream file
//     resource limits exceeded for server" every 10 s. JetStream stays
//     enabled, and the limit never grows again: freeing or adding space
//     changes nothing until JetStream restarts. That is what a full
//     data directory looks like with an embedded server.
//   - A config reload cannot raise a limit that was derived from the disk
//     ("config reload not supported for jetstream dynamic max memory and
//     store"); restarting JetStream in the process (ShutdownJetStream,
//     then EnableJetStream with the start's config, as the server's own
//     reload does when JetStream is switched back on) derives it anew
//     from the free space and recovers every stream and durable consumer
//     from disk, as a restart of the process would.
//   - When the filesystem itself runs out first (another process filled
//     it), a write fails with "no space left on device" and no answer
//     (the client times out); a mirror or source, or a clustered server,
//     disables JetStream ("JetStream out of space, will be DISABLED").
//
//   - A file store whose write failed keeps that error and refuses every
//     later write with it until it is opened again (filestore.go
//     setWriteErr: "Critical write error"): room coming back changes
//     nothing for it until JetStream restarts.
//
// So the watch, once a second: JetStream disabled, or the store past its
// limit, or the filesystem with less than [minFree] left, is full: one
// ERROR line. Once the filesystem has room again: when the store is past
// its limit, JetStream is disabled, or the filesystem itself ran out in
// the episode, JetStream is restarted with the start's config (a new
// limit from the free space, every file store opened again), else
// nothing is needed; one WARN line says storing resumed.

// storageCheckEvery is how often the watch looks.
const storageCheckEvery = time.Second

// minFree is the free space under which the filesystem counts as full
// (a file store block is written in pieces of this order).
const minFree = 64 << 10

// restartRoom is how much more than the store holds a restart's new
// limit must allow before the watch restarts JetStream: less would fill
// again at once.
const restartRoom = 1 << 20

type storageWatch struct {
	srv     *server.Server
	cfg     server.JetStreamConfig // what Start enabled JetStream with
	dataDir string
	log     *slog.Logger
	stop    chan struct{}
	done    chan struct{}
	full    bool
	since   time.Time
	// diskFull: the filesystem itself ran out in this episode. A file
	// store that failed a write then ("Critical write error … no space
	// left on device") refuses every later write with it (nats-server
	// 2.15.2 keeps a file store's write error until the store is opened
	// again), so JetStream is restarted once there is room, as for the
	// limit (a fresh user's finding: "stores again" was logged and the
	// stream took no write for 10 minutes, until serve was restarted).
	diskFull bool
	// restartFailed: a restart failed in this episode (logged once).
	restartFailed bool
	freeFunc      func(dir string) (int64, error)

	// mu guards status, what the last look saw, for [Server.StoreStatus]
	// (the state service's goroutines read it).
	mu     sync.Mutex
	status store.StoreStatus
}

func newStorageWatch(srv *server.Server, opts *server.Options, dataDir string, log *slog.Logger) *storageWatch {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &storageWatch{
		srv: srv,
		cfg: server.JetStreamConfig{
			StoreDir:     opts.StoreDir,
			SyncInterval: opts.SyncInterval,
			SyncAlways:   opts.SyncAlways,
			Strict:       !opts.NoJetStreamStrict,
			MaxMemory:    opts.JetStreamMaxMemory,
			MaxStore:     opts.JetStreamMaxStore,
			Domain:       opts.JetStreamDomain,
			CompressOK:   true,
			UniqueTag:    opts.JetStreamUniqueTag,
		},
		dataDir:  dataDir,
		log:      log,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		freeFunc: freeBytes,
		status:   store.StoreStatus{Watched: true, Stores: true},
	}
}

func (w *storageWatch) run(every time.Duration) {
	defer close(w.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			w.check()
		}
	}
}

// close stops the watch and waits for it.
func (w *storageWatch) close() {
	close(w.stop)
	<-w.done
}

// storage is what one look saw.
type storage struct {
	enabled    bool
	used, max  int64 // the store's bytes and its limit (enabled only)
	free       int64 // the filesystem's free bytes for unprivileged use
	freeErrMsg string
	// refusing: the streams whose file store keeps a write error
	// (Healthz's "write error"), sorted, and the first one's error, its
	// last part ("no space left on device"): none answers a write.
	refusing []string
	werr     string
}

func (w *storageWatch) look() storage {
	var st storage
	free, err := w.freeFunc(w.dataDir)
	if err != nil {
		st.freeErrMsg = err.Error()
		free = -1
	}
	st.free = free
	st.enabled = w.srv.JetStreamEnabled()
	if st.enabled {
		if info, err := w.srv.Jsz(&server.JSzOptions{}); err == nil && info != nil {
			st.used, st.max = int64(info.Store), info.Config.MaxStore
		}
		// A single server's health names each stream whose file store
		// failed a write: such a stream answers no later write until
		// JetStream opens it again (the client times out).
		if h := w.srv.Healthz(&server.HealthzOptions{Details: true}); h != nil {
			for _, e := range h.Errors {
				if e.Type != server.HealthzErrorStream || !strings.Contains(e.Error, "write error") {
					continue
				}
				st.refusing = append(st.refusing, e.Stream)
				if st.werr == "" {
					st.werr = e.Error[strings.LastIndex(e.Error, ": ")+2:]
				}
			}
			slices.Sort(st.refusing)
		}
	}
	return st
}

// setStatus records what a look saw for [Server.StoreStatus].
func (w *storageWatch) setStatus(st storage) {
	s := store.StoreStatus{Watched: true, Stores: !w.full && len(st.refusing) == 0, Refusing: st.refusing}
	if !s.Stores {
		s.Why = st.why()
		if !w.full && st.werr != "" {
			s.Why = "a file store failed a write: " + st.werr
		}
		w.mu.Lock()
		s.Since = w.status.Since
		w.mu.Unlock()
		switch {
		case w.full:
			s.Since = w.since
		case s.Since.IsZero():
			s.Since = time.Now()
		}
	}
	w.mu.Lock()
	w.status = s
	w.mu.Unlock()
}

// storeStatus returns what the last look saw.
func (w *storageWatch) storeStatus() store.StoreStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.status
	s.Refusing = slices.Clone(s.Refusing)
	return s
}

func (st storage) pastLimit() bool { return st.enabled && st.max > 0 && st.used > st.max }

func (st storage) diskFull() bool { return st.free >= 0 && st.free < minFree }

func (w *storageWatch) check() {
	st := w.look()
	defer func() { w.setStatus(st) }()
	full := !st.enabled || st.pastLimit() || st.diskFull()
	if full && !w.full {
		w.full, w.since = true, time.Now()
		w.log.Error(fmt.Sprintf("JetStream stopped storing: the data directory %s is full (%d bytes free; %s): "+
			"free space there; serve takes writes again by itself once there is room", w.dataDir, st.free, st.why()), "free_bytes", st.free, "store_bytes", st.used, "store_limit_bytes", st.max)
	}
	if !w.full {
		return
	}
	if st.diskFull() {
		w.diskFull = true
	}
	if st.diskFull() || st.free < 0 {
		return // no room yet (or the free space cannot be read)
	}
	if !st.enabled || st.pastLimit() || w.diskFull {
		// The server's own rule for a limit derived from the disk.
		newMax := st.free/4*3 + st.used/4*3
		if st.enabled && newMax < st.used+restartRoom {
			return // freed too little for a restart to let a write in
		}
		if err := w.restartJetStream(st); err != nil {
			if !w.restartFailed { // once an episode; tried again every look
				w.restartFailed = true
				w.log.Error("JetStream could not be restarted with room; retrying every second", "err", err, "free_bytes", st.free)
			}
			return
		}
		st = w.look()
		if !st.enabled || st.pastLimit() {
			return
		}
	}
	w.full, w.restartFailed, w.diskFull = false, false, false
	w.log.Warn(fmt.Sprintf("JetStream stores again: the data directory %s has room (%d bytes free)", w.dataDir, st.free),
		"full_for", time.Since(w.since).Round(time.Millisecond), "free_bytes", st.free, "store_bytes", st.used,
		"store_limit_bytes", st.max)
}

func (st storage) why() string {
	switch {
	case !st.enabled:
		return "the server disabled JetStream (out of space, or a write it was not permitted: see its log)"
	case st.pastLimit():
		return "the store is past the server's storage limit, set at start to 75 % of the free space"
	}
	return "the filesystem has no room"
}

// restartJetStream restarts the server's JetStream with the config it
// started with: its storage limit is derived anew from the free space.
func (w *storageWatch) restartJetStream(st storage) error {
	if !w.restartFailed {
		w.log.Warn("restarting JetStream in the process so that its storage limit takes in the freed space",
			"free_bytes", st.free, "store_bytes", st.used, "store_limit_bytes", st.max)
	}
	if st.enabled {
		if err := w.srv.ShutdownJetStream(); err != nil {
			return fmt.Errorf("stop JetStream: %w", err)
		}
	}
	cfg := w.cfg
	if err := w.srv.EnableJetStream(&cfg); err != nil {
		return fmt.Errorf("start JetStream: %w", err)
	}
	return nil
}

// freeBytes returns the free space of dir's filesystem an unprivileged
// process may use (what the server derives its limit from).
func freeBytes(dir string) (int64, error) {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(fs.Bavail) * int64(fs.Bsize), nil
}
