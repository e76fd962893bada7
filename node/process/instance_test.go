package process

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/node/bundle"
	"github.com/meshfold/meshfold/node/process/shim"
)

// A state directory made again at the same path while its shims ran (a
// wiped /var/lib, moved aside) gives the new shims cgroups of their own:
// stopping the old, orphaned shims leaves the new instances running, and
// they restart (a fresh user's finding U33: both shared one cgroup, the
// old shim's stop killed the live module and removed the cgroup, and
// every restart failed "join the module's cgroup: … no such file").
func TestStateDirMadeAgainGetsItsOwnCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroups need root")
	}
	if err := probeCgroups(DefaultCgroupParent); err != nil {
		t.Skipf("no cgroup can be made here: %v", err)
	}
	e := newEnv(t, Backoff{Initial: 20 * time.Millisecond, Max: 20 * time.Millisecond})
	e.script("sha256:a", sleeper, bundle.Manifest{})
	r1, err := Open(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r1.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	old := status(t, r1, "web")
	_ = r1.Close() // the agent goes; its shim runs on
	if err := os.Rename(e.cfg.StateDir, e.cfg.StateDir+".old"); err != nil {
		t.Fatal(err)
	}
	r2 := e.open()
	if err := r2.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	live := status(t, r2, "web")
	if live.ShimPID == old.ShimPID {
		t.Fatalf("the new runtime adopted the old shim %d", old.ShimPID)
	}
	// Stopping the orphaned old shim, as its operator does.
	if err := syscall.Kill(old.ShimPID, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitGone(t, old.ShimPID, old.ShimStart)
	if !alive(live.PID, live.PIDStart) {
		t.Fatalf("stopping the old shim killed the live module %d", live.PID)
	}
	// The live module's next start still finds its cgroup.
	if err := syscall.Kill(live.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, r2, "the module restarted", func() bool {
		st := status(t, r2, "web")
		return st.State == events.Running && st.PID != live.PID
	})
}

// A module's cgroup removed under its shim is made again at the next
// start, rather than failing every start until the want changes.
func TestVanishedCgroupIsMadeAgain(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroups need root")
	}
	if err := probeCgroups(DefaultCgroupParent); err != nil {
		t.Skipf("no cgroup can be made here: %v", err)
	}
	// A restart a second after the exit: the cgroup is removed before it.
	e := newEnv(t, Backoff{Initial: time.Second, Max: time.Second})
	e.script("sha256:a", sleeper, bundle.Manifest{})
	r := e.open()
	if err := r.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	st := status(t, r, "web")
	// The module's process goes, and its cgroup with it (what another
	// shim's stop of a shared cgroup did).
	name := shim.CgroupName("web", filepath.Join(e.cfg.StateDir, "process", "web"))
	if _, err := shim.KillCgroup(DefaultCgroupParent, name); err != nil {
		t.Fatal(err)
	}
	if left := cgroupDirs(name); len(left) > 0 {
		t.Fatalf("the cgroup was not removed (the restart came first?): %v", left)
	}
	waitFor(t, r, "the module restarted in a cgroup made again", func() bool {
		now := status(t, r, "web")
		return now.State == events.Running && now.PID != st.PID
	})
}

// cgroupDirs lists the directories of module cgroup name that exist.
func cgroupDirs(name string) []string {
	var out []string
	for _, h := range []string{"", "memory", "cpu", "pids", "freezer"} {
		d := filepath.Join("/sys/fs/cgroup", h, DefaultCgroupParent, name)
		if _, err := os.Stat(d); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// Others finds the shims of a state directory moved aside while they ran,
// and not those of the state directory itself (U33: an agent on the new
// directory refuses to start each module a second time).
func TestOthersFindsShimsOfAMovedStateDir(t *testing.T) {
	e := newEnv(t, Backoff{})
	e.script("sha256:a", sleeper, bundle.Manifest{})
	r1, err := Open(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r1.Apply(ctx(t), events.PlanModule{Name: "web", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	st := status(t, r1, "web")
	_ = r1.Close()
	if got := Others("ace", e.cfg.Root, e.cfg.StateDir); len(got) != 0 {
		t.Errorf("the state directory's own shim is listed as another's: %+v", got)
	}
	if got := Others("bob", e.cfg.Root, e.cfg.StateDir); len(got) != 0 {
		t.Errorf("another node's agent sees ace's modules: %+v", got)
	}
	moved := e.cfg.StateDir + ".old"
	if err := os.Rename(e.cfg.StateDir, moved); err != nil {
		t.Fatal(err)
	}
	got := Others("ace", e.cfg.Root, e.cfg.StateDir)
	if len(got) != 1 || got[0].Module != "web" || got[0].ShimPID != st.ShimPID || got[0].StateDir != moved || got[0].Removed {
		t.Fatalf("others after the state dir moved: %+v, want web of shim %d in %s", got, st.ShimPID, moved)
	}
	msg := (&OthersError{Node: "ace", Root: e.cfg.Root, StateDir: e.cfg.StateDir, Others: got}).Error()
	for _, want := range []string{"modules of node ace already run", "web (shim pid " + strconv.Itoa(st.ShimPID) + ", state dir " + moved + ")", "--state-dir"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal %q lacks %q", msg, want)
		}
	}
	// Moved back, it is the directory's own again.
	if err := os.Rename(moved, e.cfg.StateDir); err != nil {
		t.Fatal(err)
	}
	if got := Others("ace", e.cfg.Root, e.cfg.StateDir); len(got) != 0 {
		t.Errorf("after moving back: %+v", got)
	}
	r2 := e.open() // stops web at cleanup
	if _, ok := r2.Status("web"); !ok {
		t.Error("web not adopted after moving back")
	}
}

// A shim whose module has no process (it waits out its backoff) is found
// too, by the spec beside its log.
func TestOthersFindsAShimInBackoff(t *testing.T) {
	e := newEnv(t, Backoff{Initial: time.Hour, Max: time.Hour})
	e.script("sha256:a", "exit 3", bundle.Manifest{})
	r1, err := Open(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r1.Apply(ctx(t), events.PlanModule{Name: "job", Build: "sha256:a", RunsAs: self}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, r1, "job failed", func() bool { st := status(t, r1, "job"); return st.State == events.Failed && st.PID == 0 })
	st := status(t, r1, "job")
	_ = r1.Close()
	moved := e.cfg.StateDir + ".old"
	if err := os.Rename(e.cfg.StateDir, moved); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(st.ShimPID, syscall.SIGTERM) })
	got := Others("ace", e.cfg.Root, e.cfg.StateDir)
	if len(got) != 1 || got[0].Module != "job" || got[0].ShimPID != st.ShimPID || got[0].StateDir != moved {
		t.Fatalf("others: %+v, want job's shim %d in %s", got, st.ShimPID, moved)
	}
}
