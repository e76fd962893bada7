package storetest

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// portsHelperEnv marks this test binary re-executed by
// TestFreePortsReservedAcrossProcesses: TestHelperReservesPorts then runs
// instead of being skipped, on the ports it names.
const portsHelperEnv = "MESHFOLD_STORETEST_PORTS_HELPER"

// TestHelperReservesPorts is not a test: re-executed by
// TestFreePortsReservedAcrossProcesses, it tries to reserve each port of
// its environment and prints, for each, whether it could.
func TestHelperReservesPorts(t *testing.T) {
	list := os.Getenv(portsHelperEnv)
	if list == "" {
		t.Skip("a helper process of TestFreePortsReservedAcrossProcesses")
	}
	freePorts(t, 0) // opens the lock file
	for f := range strings.SplitSeq(list, ",") {
		p, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		ok, err := reservePort(p)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("port %d %v\n", p, ok)
	}
}

// freePorts' ports are below the kernel's ephemeral range, distinct, not
// handed out again while the test holds them (in this process or
// another), and free again for others once it ends.
func TestFreePortsReservedAcrossProcesses(t *testing.T) {
	lo, hi, err := portRange()
	if err != nil {
		t.Fatal(err)
	}
	var ports []int
	t.Run("hold", func(t *testing.T) {
		ports = freePorts(t, 4)
		if s := slices.Compact(slices.Sorted(slices.Values(ports))); len(s) != 4 {
			t.Fatalf("ports %v: not distinct", ports)
		}
		for _, p := range ports {
			if p < lo || p >= hi {
				t.Fatalf("port %d outside [%d, %d)", p, lo, hi)
			}
			if ok, _ := reservePort(p); ok {
				t.Fatalf("port %d reserved twice in one process", p)
			}
		}
		if got := helperReserves(t, ports); !slices.Equal(got, []bool{false, false, false, false}) {
			t.Fatalf("another process reserved %v of the held ports %v", got, ports)
		}
	})
	// The subtest's cleanup released them.
	if got := helperReserves(t, ports); !slices.Equal(got, []bool{true, true, true, true}) {
		t.Fatalf("another process reserved %v of the released ports %v", got, ports)
	}
}

// helperReserves runs TestHelperReservesPorts in a process of its own
// and returns, for each of ports, whether it reserved it.
func helperReserves(t *testing.T, ports []int) []bool {
	t.Helper()
	var list []string
	for _, p := range ports {
		list = append(list, strconv.Itoa(p))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperReservesPorts$", "-test.count=1")
	cmd.Env = append(os.Environ(), portsHelperEnv+"="+strings.Join(list, ","))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	var got []bool
	for _, p := range ports {
		switch {
		case strings.Contains(string(out), fmt.Sprintf("port %d true\n", p)):
			got = append(got, true)
		case strings.Contains(string(out), fmt.Sprintf("port %d false\n", p)):
			got = append(got, false)
		default:
			t.Fatalf("helper said nothing of port %d:\n%s", p, out)
		}
	}
	return got
}
