package query

// SetFleetGets sets how many snapshots FleetSummary reads one get at a
// time before it reads them in a whole pass, and returns the old value.
func SetFleetGets(n int) int {
	old := fleetGets
	fleetGets = n
	return old
}
