package storetest_test

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestProcServer: the standalone server takes a stream and a publish, its
// pid is the process serving them (killing it closes the connection), and
// ProcCPU reads a live process and fails on a gone one.
func TestProcServer(t *testing.T) {
	s := storetest.StartProcServer(t)
	nc, js := s.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, cfg, err := store.EnsureStream(ctx, js, store.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, cfg.Subjects().Event("ace", events.KindHave), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if _, err := storetest.ProcCPU(s.Pid()); err != nil {
		t.Fatal(err)
	}
	// Burn 50 ms of CPU (by rusage), then /proc must say as much, to
	// its 10 ms resolution.
	var ru syscall.Rusage
	for x := 0; ; x++ {
		if x%1000 == 0 {
			if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
				t.Fatal(err)
			}
			if time.Duration(ru.Utime.Nano()+ru.Stime.Nano()) >= 50*time.Millisecond {
				break
			}
		}
	}
	self, err := storetest.ProcCPU(os.Getpid())
	if err != nil || self < 40*time.Millisecond {
		t.Fatalf("own CPU %v, %v: want at least 40ms", self, err)
	}
	if err := syscall.Kill(s.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); nc.IsConnected(); {
		if time.Now().After(deadline) {
			t.Fatal("still connected 10 s after the server's pid was killed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := storetest.ProcCPU(1 << 30); err == nil {
		t.Fatal("ProcCPU of a missing pid: no error")
	}
}
