package query_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshfold/meshfold/events"
	"github.com/meshfold/meshfold/query"
	"github.com/meshfold/meshfold/reconcile"
	"github.com/meshfold/meshfold/reconcile/audit"
	"github.com/meshfold/meshfold/reconcile/reconciletest"
	"github.com/meshfold/meshfold/store"
	"github.com/meshfold/meshfold/store/storetest"
)

// TestFleetSummary checks that the fleet read from the summaries stored
// beside the snapshots (FleetSummary) makes every row the snapshots make
// (Fleet): nodes with a summary, with one of format 1 (JSON, as builds
// before format 2 wrote it), without one (a build that wrote none),
// with one of another format, with an undecodable snapshot, with a
// snapshot of a newer format, and a deleted one; the nodes without a
// usable summary read one get each, then in a whole pass.
func TestFleetSummary(t *testing.T) {
	// Not parallel: it sets fleetGets and fleetBatch, every reader's.
	_, nc, js, _, cfg := storetest.StartStream(t, store.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	snaps, err := store.OpenSnapshots(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 60)
	for i := range names {
		names[i] = fmt.Sprintf("n%02d", i)
	}
	s := reconciletest.Scripted(names, 20*len(names), 5, nil)
	now := s.TimeOf(s.Next()).Add(3 * time.Minute)
	put := func(node string, state, summary []byte) {
		t.Helper()
		sums := map[string][]byte{}
		if summary != nil {
			sums[node] = summary
		}
		if err := snaps.PutSummarizedAt(ctx, events.Partition(node, cfg.Partitions), map[string][]byte{node: state}, sums, nil); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range names {
		st := s.State(n)
		data, err := reconcile.MarshalState(st)
		if err != nil {
			t.Fatal(err)
		}
		sum, err := reconcile.MarshalSummary(st)
		if err != nil {
			t.Fatal(err)
		}
		switch i % 4 {
		case 0:
			put(n, data, sum)
		case 1:
			put(n, data, nil) // as a build that wrote no summary left it
		case 2:
			// Of another format: this build's, renumbered; and JSON.
			other := "99:" + strings.TrimPrefix(string(sum), "3:")
			if i%8 == 6 {
				other = strings.Replace(string(jsonSummary(t, st)), `{"format":1,`, `{"format":99,`, 1)
			}
			if other == string(sum) {
				t.Fatalf("%s: a summary of another format is this one: %s", n, sum)
			}
			put(n, data, []byte(other))
		case 3:
			put(n, data, jsonSummary(t, st)) // format 1, as the builds before format 2 wrote it
		}
	}
	put("bad", []byte("{"), nil)
	newer := `{"format":9,"node":"newer","seq":3}`
	put("newer", []byte(newer), []byte(`{"format":1,"snapshot":9,"node":"newer","seq":3}`))
	put("gone", []byte(`{"format":1,"node":"gone","seq":1}`), []byte(`{"format":1,"snapshot":1,"node":"gone","seq":1}`))
	kv, err := js.KeyValue(ctx, snaps.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, fmt.Sprintf("node.%d.gone", events.Partition("gone", cfg.Partitions))); err != nil {
		t.Fatal(err)
	}

	r, err := query.New(nc, query.Config{Stream: cfg})
	if err != nil {
		t.Fatal(err)
	}
	rows := func(nvs []query.NodeView) map[string]string {
		out := map[string]string{}
		for _, nv := range nvs {
			row := nv.Row(now, 10*time.Minute)
			b, err := json.Marshal(row)
			if err != nil {
				t.Fatal(err)
			}
			if _, dup := out[nv.Node]; dup {
				t.Fatalf("%s twice", nv.Node)
			}
			out[nv.Node] = string(b) + "\n" + row.Line(24) + "\n" + audit.FleetStuckText([]audit.FleetRow{row}) + audit.FleetFailedText([]audit.FleetRow{row})
		}
		return out
	}
	full, err := r.Fleet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := rows(full)
	if len(want) != len(names)+2 || !strings.Contains(want["newer"], "newer build") || !strings.Contains(want["bad"], `"error"`) {
		t.Fatalf("Fleet: %d rows; newer %s; bad %s", len(want), want["newer"], want["bad"])
	}
	for _, gets := range []int{1000, 2} {
		old := query.SetFleetGets(gets)
		nvs, err := r.FleetSummary(ctx)
		query.SetFleetGets(old)
		if err != nil {
			t.Fatal(err)
		}
		got := rows(nvs)
		// Read from the summaries: the provisioner accounts, which a row
		// does not show, are left out; from the snapshots, kept.
		accounts := map[string]string{}
		for _, nv := range full {
			accounts[nv.Node] = nv.View.ProvisionerAccount
		}
		summarized := 0
		for _, nv := range nvs {
			i := slices.Index(names, nv.Node)
			switch {
			case i >= 0 && (i%4 == 0 || i%4 == 3) && accounts[nv.Node] != "" && nv.View.ProvisionerAccount == "":
				summarized++
			case i >= 0 && (i%4 == 0 || i%4 == 3) && accounts[nv.Node] != "":
				t.Errorf("gets %d: %s read from its snapshot, not from its summary of format %d", gets, nv.Node, 3-2*(i%4/3))
			case nv.View.ProvisionerAccount != accounts[nv.Node]:
				t.Errorf("gets %d: %s read from its summary", gets, nv.Node)
			}
		}
		if summarized == 0 {
			t.Errorf("gets %d: no node read from its summary", gets)
		}
		for _, n := range slices.Sorted(maps.Keys(want)) {
			if got[n] != want[n] {
				t.Errorf("gets %d: %s:\n got %s\nwant %s", gets, n, got[n], want[n])
			}
		}
		if len(got) != len(want) {
			t.Errorf("gets %d: %d rows, want %d", gets, len(got), len(want))
		}
		// FleetRows makes the same rows on the decoding workers.
		old = query.SetFleetGets(gets)
		frs, err := r.FleetRows(ctx, now, 10*time.Minute)
		query.SetFleetGets(old)
		if err != nil || len(frs) != len(want) {
			t.Fatalf("gets %d: FleetRows: %d rows, %v", gets, len(frs), err)
		}
		for _, row := range frs {
			b, _ := json.Marshal(row)
			if w, _, _ := strings.Cut(want[row.Node], "\n"); string(b) != w {
				t.Errorf("gets %d: FleetRows: %s:\n got %s\nwant %s", gets, row.Node, b, w)
			}
		}
		// FleetRowsEach hands the same rows to its func, batch by batch,
		// and returns its results in FleetRows' order: in batches of 7,
		// some of the summaries' and some of the snapshots read after.
		old, oldBatch := query.SetFleetGets(gets), query.SetFleetBatch(7)
		batches, err := query.FleetRowsEach(ctx, r, now, 10*time.Minute, func(rows []audit.FleetRow) []string {
			if len(rows) > 7 {
				t.Errorf("gets %d: FleetRowsEach: a batch of %d rows", gets, len(rows))
			}
			var out []string
			for _, row := range rows {
				b, _ := json.Marshal(row)
				out = append(out, string(b))
			}
			return out
		})
		query.SetFleetGets(old)
		query.SetFleetBatch(oldBatch)
		if err != nil {
			t.Fatalf("gets %d: FleetRowsEach: %v", gets, err)
		}
		if each := slices.Concat(batches...); len(each) != len(frs) || len(batches) < 2 {
			t.Errorf("gets %d: FleetRowsEach: %d rows in %d batches, want %d", gets, len(each), len(batches), len(frs))
		} else {
			for i, row := range frs {
				if b, _ := json.Marshal(row); each[i] != string(b) {
					t.Errorf("gets %d: FleetRowsEach: row %d:\n got %s\nwant %s", gets, i, each[i], b)
				}
			}
		}
	}
}

// jsonSummary is st's fleet summary in format 1, as builds before format
// 2 wrote it: {"format":1,"snapshot":1, then the fields of the view's
// summary}, printable ASCII.
func jsonSummary(t *testing.T, st *reconcile.State) []byte {
	t.Helper()
	v, err := json.Marshal(st.View().FleetSummary())
	if err != nil {
		t.Fatal(err)
	}
	b := []byte(`{"format":1,"snapshot":1,` + string(v[1:]))
	for _, c := range b {
		if c < 0x20 || c >= 0x7f {
			t.Fatalf("%s: its JSON summary is not printable ASCII: %s", st.Node, b)
		}
	}
	return b
}
