package query_test

import (
	"testing"

	"github.com/meshfold/meshfold/query"
)

// Through keeps the earlier read's checkpoints (the snapshots loaded
// after it cover at least them) and takes the later read's newest
// events (the follow started before it delivers every later one).
func TestLagThrough(t *testing.T) {
	t.Parallel()
	before := query.SnapshotLag{Partitions: []query.PartitionLag{{Partition: 0, Checkpoint: 5, Last: 9}, {Partition: 1, Checkpoint: 7, Last: 7}}}
	later := query.SnapshotLag{Partitions: []query.PartitionLag{{Partition: 0, Checkpoint: 9, Last: 12}, {Partition: 1, Checkpoint: 11, Last: 11}}}
	got, err := before.Through(later)
	if err != nil {
		t.Fatal(err)
	}
	if p := got.Partitions; p[0].Checkpoint != 5 || p[0].Last != 12 || p[1].Checkpoint != 7 || p[1].Last != 11 || len(got.Behind()) != 2 {
		t.Errorf("through: %+v", got)
	}
	if before.Partitions[0].Last != 9 {
		t.Errorf("Through changed its receiver: %+v", before)
	}
	if _, err := before.Through(query.SnapshotLag{}); err == nil {
		t.Error("another number of partitions: no error")
	}
}
