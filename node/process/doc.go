// Package process is the node agent's process runtime (DESIGN.md §8): a
// [node.Runtime] that runs each module's bundle as a real process, as the
// module's Unix account, supervised by a per-module shim that outlives the
// agent.
//
// # Shims
//
// [Runtime.Apply] fetches the row's bundle (a [Fetcher]), resolves runs_as
// in the user database (an unknown user fails the apply, matching
// [ErrUnknownUser]) and starts a shim. An agent that is root refuses a row
// with an empty runs_as: the apply fails (matching [ErrNoRunsAs]) rather
// than run the module as root without the want saying so; a want that
// means root says runs_as "root". The shim (package node/process/shim) is
// the command of [Config.Shim] (the meshfold-shim binary, or meshfold as
// `meshfold shim DIR`) with the module's directory
// <state dir>/process/<module> as its argument, in its own session. The
// shim reads spec.json there, records its pid and start time (shim.json),
// listens on shim.sock and starts the module: the manifest's command,
// relative to the bundle, in the bundle as working directory, in its own
// process group, as the account's uid, gid and exactly the account's
// groups (only when the agent is root; otherwise as the agent's user,
// which Open logs, Apply logs once per module whose runs_as differs, and
// the have reports), with a minimal environment (PATH, USER, LOGNAME,
// HOME, MESHFOLD_NODE, MESHFOLD_MODULE, MESHFOLD_ROOT, then the manifest's
// env), stdin /dev/null, stdout and stderr into module.log, each line
// tagged with its time and stream (rotated at [Config.LogMaxMB]; the
// shim's own shim.log is capped the same way). Apply returns once that
// first start happened, or failed: a module that crashes still counts as
// applied.
//
// # The whole tree
//
// Everything a module starts is the module's (DESIGN.md §8). The shim is
// a child subreaper: an orphan of the module (a daemon's double fork, a
// shell's children) becomes the shim's child, and the shim reaps every
// child, so no zombie accumulates. Where the agent can make cgroups (it is
// root, and a probe cgroup under [Config.CgroupParent] could be made; v1
// or v2, through containerd's cgroups library), each module runs in a
// cgroup of its own, <parent>/<module>-<hash of its directory>, born in it
// (clone3 into the cgroup on v2; on v1 the shim forks from a thread it
// moved in), with the manifest's limits (memory bytes, cpu cores as a CFS
// quota, pids); an exit during which the cgroup's OOM killer struck is
// "oom". Where none can be made, Open says so once and a module's tree is
// every descendant of its shim. Stopping a module stops its whole tree:
// the stop signal to every process of it (so each one's handler runs),
// up to the stop timeout for all of them to exit, then SIGKILL to what is
// left. When the main process exits on its own, what it left behind is
// stopped the same way before the exit is reported: a restart or a new
// build never meets the previous run's processes.
//
// The shim restarts an exited module after a backoff ([Backoff]: 1 s
// doubling to 5 min, reset after 10 min of running), ends a backoff at
// once when told a filled file was written ([Runtime.Filled]), and gives a
// running module its on_fill action (a restart, or a signal to its main
// process).
//
// A new build or account replaces the shim: the old one is stopped and gone
// before the new one starts. [Runtime.Remove] stops the shim and deletes the
// module's directory (spec, logs). [Runtime.Running] reports, per module,
// state (running, failed while it waits to restart, stopped), restarts
// since the apply, the last exit ("status 1", "signal SIGKILL", "start:
// …") and since; [Runtime.Changes] signals every change, which the agent
// turns into a have.
//
// # Health
//
// A manifest's health check (exec, http, tcp or notify; DESIGN.md §11)
// runs in the shim, so it goes on while the agent restarts; see health.go
// for the rules. The status, and the have, say starting, healthy or
// unhealthy (absent without a check; unhealthy while the module waits to
// restart); with restart, an unhealthy module is stopped, its exit is
// "unhealthy", and it is started again after the crash backoff.
//
// # Agent restarts
//
// [Runtime.Close] lets go of the shims without stopping them. The next
// runtime adopts every shim it finds in the state directory, on its first
// use rather than in [Open] (an agent refused by the node's lease uses its
// runtime for nothing, and so never reaches the shims of the agent that
// holds the lease): one whose recorded
// pid is alive with its recorded start time (/proc/<pid>/stat field 22)
// in the recorded boot (/proc/sys/kernel/random/boot_id), whose socket's
// peer is that pid, and whose status names itself. A shim found dead has
// its module killed, only if the module's recorded pid still has its
// recorded start time in this boot (and whatever is left in its cgroup,
// or, without one, every process whose environment names the node, root
// and module), and is reported stopped, so the agent
// applies or removes it; a shim that dies while the agent runs is replaced
// at once (restarts + 1). A shim's module does not outlive it: every
// process a shim starts has SIGKILL as its parent-death signal, and what
// the module forked is the next runtime's to kill ([Others] does not list
// such orphans of the state directory's own shims, so the agent starts).
// Under systemd, the agent's unit needs
// KillMode=process, or a restart of the unit kills every module with it.
//
// # Tests
//
// The package's tests start real shims without the meshfold command: the
// test binary re-executes itself (TestMain runs [shim.Main] when the
// environment variable MESHFOLD_PROCESS_TEST_SHIM is 1, which
// [Config.ShimEnv] sets), and cmd/meshfold's TestMain does the same for
// `shim`. Modules there are shell scripts in bundles the tests write,
// served by a fake [Fetcher].
//
// # What it does not do
//
// No namespaces: a module sees the host's filesystem, network and
// processes; its account and its cgroup are its isolation (see
// docs/architecture.md, "The process runtime").
//
// # Where builds come from: the Fetcher
//
// The runtime does not know the object store. It asks a [Fetcher] for a
// build's unpacked bundle:
//
//	type Fetcher interface {
//		Fetch(ctx context.Context, build string) (dir string, m bundle.Manifest, err error)
//	}
//
// Fetch returns the directory holding the unpacked bundle of build
// (meshfold.json at its root) and its parsed, validated manifest. It is
// called on every Apply, so it must be cheap for a build already cached.
// The directory must stay in place, unchanged, while a module runs that
// build, and every file the command needs must be readable (and the
// command executable) by the module's account: the runtime runs the
// command as that account with its working directory set to dir, and
// changes no ownership or mode. Any error fails the apply, and its text
// becomes the settle's error, so it must say what went wrong (a build of
// another scheme, a missing bundle, a digest mismatch) and never contain a
// secret. The implementation is package node/bundle's cache; tests use a
// fake that returns a directory they made.
//
// A Fetcher may also implement [Pruner]: after every Apply and Remove the
// runtime calls Prune with every build its modules still use, and the
// fetcher may delete the bundles of the others.
package process
