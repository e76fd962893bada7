package query

// SetFleetGets sets how many snapshots FleetSummary reads one get at a
// time before it reads them in a whole pass, and returns the old value.
func SetFleetGets(n int) int {
	old := fleetGets
	fleetGets = n
	return old
}

// SetFleetBatch sets how many snapshots a decoding job holds, and returns
// the old value.
func SetFleetBatch(n int) int {
	old := fleetBatch
	fleetBatch = n
	return old
}
