# meshfold — see README.md.
GO ?= go

.PHONY: build test vet bench bench-scale bench-shim bench-all fuzz serve demo fmt chaos dist package

# What `meshfold version` says, set at link time (deploy/Dockerfile builds
# the same way as make dist: static, trimmed paths, these flags).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS = -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)

## build: ./bin/meshfold and, beside it, ./bin/meshfold-shim, the per-module
## supervisor the node agent starts (static, like the packages' one: a node
## runs one per module) (the first build compiles every dependency and takes
## minutes; later ones take seconds)
build:
	$(GO) build -ldflags "-X main.version=$(VERSION) -X main.commit=$(COMMIT)" -o bin/meshfold ./cmd/meshfold
	CGO_ENABLED=0 $(GO) build -ldflags "-X main.version=$(VERSION) -X main.commit=$(COMMIT)" -o bin/meshfold-shim ./cmd/meshfold-shim

## test: vet, then every test with the race detector (what CI runs), then
## the packages' test (deploy/package is a module of its own). Most tests
## wait on servers, leases and timers rather than compute, so each package
## runs four at a time (-parallel 4; the default is GOMAXPROCS, 2 on CI)
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -parallel 4 -timeout 20m ./...
	cd deploy/package && $(GO) vet ./... && $(GO) test -count=1 -timeout 10m ./...

## dist: the static binaries packages ship, dist/meshfold and dist/meshfold-shim,
## with their version and commit (the first build compiles everything again:
## -trimpath)
dist:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o dist/meshfold ./cmd/meshfold
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o dist/meshfold-shim ./cmd/meshfold-shim

## package: dist/meshfold_*.deb and dist/meshfold-*.rpm (nfpm as a library,
## deploy/package): the two binaries, hardened systemd units, /etc/meshfold
package: dist
	cd deploy/package && $(GO) run . -binary ../../dist/meshfold -shim ../../dist/meshfold-shim -version $(VERSION) -out ../../dist

## chaos: issue 12's chaos suite at full size: 50k events over 200 nodes, serve
## SIGKILLed 30 times and restarted 10 times, 10k malformed events (make test
## runs a short version of it)
chaos:
	MESHFOLD_CHAOS=full $(GO) test -count=1 -timeout 60m -run '^TestChaos$$' -v ./cmd/meshfold

vet:
	$(GO) vet ./...

## serve: the reconciler with an embedded NATS server, data in ./meshfold-data
serve:
	$(GO) run ./cmd/meshfold serve

## demo: incident 1 on node ace, everything in one process; prints the timeline
demo:
	$(GO) run ./cmd/meshfold demo

## bench: issue 17's figures, each beside its raw JetStream baseline of the same
## run: meshfold reconcile processes against a nats-server process (catch-up,
## group catch-up, memory per node, recovery), then the knock latency under load;
## then issue 24's restarts: kill -9 and an immediate restart of serve, reconcile
## and a node agent, 20 each, start to first plan (or have), p50 and max; then
## issue 23's rollout over 10,000 stand-in nodes against the same flow with no
## controller (ratio) and the controller's state per target; then issue 24's
## failover: per leader kill on a 3-server cluster, JetStream's own recovery (raw),
## the reconciler's first plan, and the difference. Issue 27's catch-up on the
## bench's mix and on an effect-dense one (stored, stored with a fifth of a CPU
## taken, a first refold against a raw read+publish pipeline) runs second, then
## its live figure on both mixes (against a raw publish + consume of the same
## inputs, and against one that also publishes and reads back as many effects).
bench:
	$(GO) test -run '^$$' -bench '^BenchmarkOutside$$' -benchtime 1x -timeout 60m ./cmd/meshfold
	$(GO) test -run '^$$' -bench '^BenchmarkCatchUpMixes$$' -benchtime 1x -timeout 30m ./cmd/meshfold
	$(GO) test -run '^$$' -bench '^BenchmarkLiveMixes$$' -benchtime 1x -timeout 30m ./cmd/meshfold
	$(GO) test -run '^$$' -bench '^BenchmarkKnockLatency$$' -benchtime 1x -timeout 10m ./engine
	$(GO) test -run '^$$' -bench '^BenchmarkRestartAfterKill$$' -benchtime 1x -timeout 20m ./cmd/meshfold
	$(GO) test -run '^$$' -bench '^BenchmarkRollout10k$$' -benchtime 1x -timeout 20m ./engine/rollouts
	$(GO) test -run '^$$' -bench '^BenchmarkLeaderFailover$$' -benchtime 1x -timeout 30m ./engine

## bench-scale: issue 27's figures at 100,000 nodes (MESHFOLD_SCALE_NODES
## changes the count), each beside its baseline: `meshfold fleet -o json`
## against a raw read of every snapshot key of the same bucket; the console's
## fleet page at 20,000 and 100,000 stand-in nodes in headless Chromium (size,
## serve time, first contentful paint), and the making of its index of rows;
## one meshfold reconcile process against a nats-server process at 1,000, 10,000
## and 100,000 nodes (20 events a node): cold refold against the raw read,
## restart after 200k vs 2M events, heap and RSS per node loaded from snapshots; at 100,000
## nodes, a want published at a restart's checkpoint past its tail to its plan, and a
## SIGTERM there to the exit; the knock p99 under 50,000 events/s of
## 100,000 other nodes' haves against a raw publish → consume hop; a group of
## 4 meshfold reconcile processes on a 3-server cluster (R3, loopback): cold
## catch-up against the raw read on the same cluster, CPU per folded event per
## instance and per server
bench-scale: bench-shim
	$(GO) test -run '^$$' -bench '^BenchmarkFleetJSON100k$$' -benchtime 1x -timeout 30m ./cmd/meshfold
	$(GO) test -run '^$$' -bench '^BenchmarkConsoleFleet100k$$' -benchtime 1x -timeout 30m ./e2e
	$(GO) test -run '^$$' -bench '^BenchmarkFleetIndex100k$$' -benchtime 3x -timeout 10m ./console
	$(GO) test -run '^$$' -bench '^BenchmarkReconcileLoad100k$$' -benchtime 1x -timeout 20m ./cmd/meshfold
	$(GO) test -run '^$$' -bench '^BenchmarkReconcileScale$$' -benchtime 1x -timeout 60m ./cmd/meshfold
	$(GO) test -run '^$$' -bench '^BenchmarkRestartLive$$' -benchtime 1x -timeout 30m ./cmd/meshfold
	MESHFOLD_KNOCK_NODES=100000 $(GO) test -run '^$$' -bench '^BenchmarkKnockLatency$$' -benchtime 1x -timeout 20m ./engine
	$(GO) test -run '^$$' -bench '^BenchmarkGroupScale$$' -benchtime 1x -timeout 60m ./cmd/meshfold

## bench-shim: issue 27's supervision figures (run as root): 100 modules of
## sleep as nobody, each under its own shim (meshfold-shim, built by the
## benchmark as make build does): PSS and RSS per shim, where one shim's PSS
## is, and the agent side's RSS (bench-scale runs it first)
bench-shim:
	$(GO) test -run '^$$' -bench '^BenchmarkShimMemory$$' -benchtime 1x -timeout 20m ./node/process

## bench-all: every benchmark of every package
bench-all:
	$(GO) test -run '^$$' -bench . -benchmem ./...

## fuzz: a short fuzz run of decode-then-fold
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecodeFold -fuzztime 60s ./reconcile

fmt:
	gofmt -w $$(git ls-files '*.go')
