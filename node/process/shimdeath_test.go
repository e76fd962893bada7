package process

import (
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node/bundle"
)

// asNobody skips a test that runs its module as nobody where that cannot
// be done (the agent is not root, or there is no user nobody).
func asNobody(t *testing.T) *user.User {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("runs its module as nobody: needs root")
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	return u
}

// A module's main process does not outlive its shim: a shim killed -9
// while no agent watches (the agent killed too, as a careless kill -9 of
// every process group, the OOM killer or a stop of the shims' scope do)
// takes its module with it, the runs_as switch kept (a fresh user's
// finding F3: the module ran on, orphaned, and the node's next agent
// refused to start beside it).
func TestModuleDiesWithItsShim(t *testing.T) {
	nobody := asNobody(t)
	e := newEnv(t, Backoff{})
	e.script("sha256:a", sleeper, bundle.Manifest{})
	r1, err := Open(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r1.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: "nobody"}); err != nil {
		t.Fatal(err)
	}
	st := status(t, r1, "web")
	waitExec(t, st.PID, "sleep")
	if uid := procField(t, st.PID, "Uid:"); uid[0] != nobody.Uid {
		t.Fatalf("module uid %v, want %s (nobody)", uid, nobody.Uid)
	}
	_ = r1.Close()
	t.Cleanup(func() { _ = syscall.Kill(-st.PID, syscall.SIGKILL) }) // should the test fail: the module it started
	killed := time.Now()
	if err := syscall.Kill(st.ShimPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if alive(st.PID, st.PIDStart) && !waitExit(st.PID, deadline) {
		t.Fatalf("module %d still runs %s after its shim %d was killed", st.PID, deadline, st.ShimPID)
	}
	t.Logf("shim killed -9 → its module gone: %s", time.Since(killed))
}

// What the module forked (a shell's child: no parent-death signal of its
// own) outlives a shim killed -9; the runtime opened next on the same
// state directory takes it for its own, not another state directory's
// ([Others] does not list it), kills it and reports the module stopped,
// and the agent starts it again. An agent on another state directory is
// still refused, told the module has no shim and which process group to
// stop, with no shim pid to kill.
func TestOrphansOfAKilledShimAreTheStateDirs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		noCgroups bool
	}{{"cgroup", false}, {"no cgroup", true}} {
		t.Run(tc.name, func(t *testing.T) {
			asNobody(t)
			e := newEnv(t, Backoff{})
			e.cfg.NoCgroups = tc.noCgroups
			e.script("sha256:a", `sleep 3600 & echo started; wait`, bundle.Manifest{})
			r1, err := Open(e.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := r1.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: "nobody"}); err != nil {
				t.Fatal(err)
			}
			st := status(t, r1, "web")
			var child int
			waitFor(t, r1, "the module's child", func() bool {
				for _, pid := range moduleProcs(t, e.cfg.Root, "web") {
					if pid != st.PID {
						child = pid
					}
				}
				return child != 0
			})
			waitExec(t, child, "sleep")
			childStart, err := startTime(child)
			if err != nil {
				t.Fatal(err)
			}
			_ = r1.Close()
			t.Cleanup(func() { _ = syscall.Kill(-st.PID, syscall.SIGKILL) })
			if err := syscall.Kill(st.ShimPID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			waitGone(t, st.ShimPID, st.ShimStart)
			waitGone(t, st.PID, st.PIDStart) // the parent-death signal
			if !alive(child, childStart) {
				t.Fatalf("the module's child %d died with the shim: the test wants an orphan", child)
			}

			if got := Others("ace", e.cfg.Root, e.cfg.StateDir); len(got) != 0 {
				t.Errorf("the orphan of the state directory's own shim is listed as another's: %+v", got)
			}
			got := Others("ace", e.cfg.Root, e.cfg.StateDir+".other")
			if len(got) != 1 || got[0].ShimPID != 0 || got[0].PID != child || got[0].PGID != st.PID {
				t.Fatalf("others of another state dir: %+v, want web's child %d in group %d, no shim", got, child, st.PID)
			}
			msg := (&OthersError{Node: "ace", Root: e.cfg.Root, StateDir: e.cfg.StateDir + ".other", Others: got}).Error()
			for _, want := range []string{
				"web (pid " + strconv.Itoa(child) + ", process group " + strconv.Itoa(st.PID) + ")",
				"without a shim (it was killed or crashed), not one that " + e.cfg.StateDir + ".other records",
				"kill -TERM -- -" + strconv.Itoa(st.PID),
			} {
				if !strings.Contains(msg, want) {
					t.Errorf("refusal %q lacks %q", msg, want)
				}
			}
			for _, wrong := range []string{"started from another state directory", "shim pid", "--state-dir"} {
				if strings.Contains(msg, wrong) {
					t.Errorf("refusal %q says %q", msg, wrong)
				}
			}

			began := time.Now()
			r2 := e.open()
			if now := status(t, r2, "web"); now.State != events.Stopped || now.Exit != "supervisor lost" {
				t.Errorf("the module of the killed shim: %+v, want stopped, supervisor lost", now)
			}
			if alive(child, childStart) {
				t.Errorf("the orphaned child %d still runs after the runtime's adoption", child)
			}
			if err := r2.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: "nobody"}); err != nil {
				t.Fatal(err)
			}
			if now := status(t, r2, "web"); now.State != events.Running || now.ShimPID == st.ShimPID {
				t.Errorf("after the apply: %+v, want running under a new shim", now)
			}
			t.Logf("runtime opened → orphan killed, module started again: %s", time.Since(began))
		})
	}
}
