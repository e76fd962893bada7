package process

import "github.com/meshfold/meshfold/node/process/shim"

// The shim's names under what this package's tests called them before the
// shim moved to its own package (node/process/shim).
type (
	spec     = shim.Spec
	identity = shim.Identity
	request  = shim.Request
	account  = shim.Account
)

const (
	specFile   = shim.SpecFile
	shimFile   = shim.ShimFile
	moduleFile = shim.ModuleFile
	sockFile   = shim.SockFile
	logFile    = shim.LogFile
	opStatus   = shim.OpStatus
	opWake     = shim.OpWake
	streamOut  = shim.StreamOut
	streamErr  = shim.StreamErr
	streamShim = shim.StreamShim
)

var (
	ShimMain     = shim.Main
	bootID       = shim.BootID
	startTime    = shim.StartTime
	alive        = shim.Alive
	writeJSON    = shim.WriteJSON
	listenUnix   = shim.ListenUnix
	waitExit     = shim.WaitExit
	probeCgroups = shim.ProbeCgroups
)
