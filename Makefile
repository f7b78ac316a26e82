# edgegate: the front door. `make help` lists the targets.

GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
DIST    := dist
CMDS    := edgegate edgesim edgecat devkafka
# Release builds for ARM gateways (make cross, and so make deb's armhf and
# arm64 packages) leave out what a gateway never runs: nodemo leaves out
# `edgegate demo` (kfake, a second Kafka client stack, the simulator's MQTT
# clients); nethttpomithttp2 leaves out net/http's HTTP/2, which nothing
# uses (the HTTP endpoint and WebSocket listener speak HTTP/1.1). make
# build, make demo and go run keep everything.
RELEASE_TAGS := nodemo,nethttpomithttp2
# staticcheck and nfpm have their own module (tools/go.mod), so that their
# dependencies stay out of the module graph of everyone who imports ours.
TOOL    := $(GO) tool -modfile=tools/go.mod

.PHONY: help build demo test lint check bench bench-footprint bench-footprint-short fuzz cross deb e2e crash-long nemesis clean

help:
	@echo "make demo    first run: in-process Kafka, the gateway and a simulated fleet"
	@echo "make test    unit and integration tests (with the race detector)"
	@echo "make lint    gofmt, go vet, staticcheck"
	@echo "make check   lint + test"
	@echo "make e2e     the built binary with mosquitto_pub, kcat and qemu-user (ARM builds);"
	@echo "             the MQTT clients devices run (paho, python3-paho-mqtt, MQTT.js, mosquitto_pub)"
	@echo "             through gateway restarts and connection cuts, counted exactly in Kafka;"
	@echo "             20 SIGKILL cycles under QoS 1 load and 24 power cuts (FUSE, needs fuse3)"
	@echo "             under QoS 1 and 2 load, each then checked exactly in Kafka"
	@echo "make crash-long  the same loops with 200 SIGKILLs and 300 power cuts"
	@echo "make nemesis the real binary under a seeded schedule of faults and hostile clients, with four"
	@echo "             client stacks, then checked exactly in Kafka (NEMESIS_TIME, default 150s; NEMESIS_SEED"
	@echo "             replays a run; NEMESIS_FLAGS='-nemesis.only kafka,sigterm -nemesis.emfile -nemesis.keep')"
	@echo "make bench   benchmarks (decode+aggregate, whole-gateway ingest)"
	@echo "make bench-footprint  mosquitto, plain mochi and edgegate on the same loads: CPU per reading,"
	@echo "             peak and idle RSS, PUBACK p50/p99, with ratios (about 10 min; needs mosquitto)"
	@echo "make bench-footprint-short  the same, one round of short runs (under a minute)"
	@echo "make fuzz    fuzz the payload decoders (JSON, Sparkplug B), the live MQTT listener, queue recovery and the state file check, FUZZTIME each (default 60s)"
	@echo "make cross   static stripped release binaries for linux arm v6, arm v7, arm64 into $(DIST)/;"
	@echo "             prints their sizes, fails if armv7 is over ARMV7_BUDGET_MIB (12)"
	@echo "make deb     .deb packages (armhf, arm64, amd64) with a systemd unit, into $(DIST)/"
	@echo "make build   bin/edgegate, bin/edgesim, bin/edgecat, bin/devkafka for this machine"

build:
	@mkdir -p bin
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/ $(addprefix ./cmd/,$(CMDS))

demo:
	$(GO) run ./cmd/edgegate demo

test:
	$(GO) test -race -count=1 ./...
	# Without -race: the outage test trips a known data race inside sarama
	# (IBM/sarama#2913), so it is skipped above and run here.
	$(GO) test -count=1 -run TestOutageExactlyOnce ./bridge
	# The race detector multiplies memory: the abuse test's RSS limit is
	# checked here.
	$(GO) test -count=1 -run TestAbuse ./gateway

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags e2e ./cmd/edgegate ./cmd/edgecat ./cmd/edgesim
	$(GO) vet -tags $(RELEASE_TAGS) ./cmd/edgegate
	$(TOOL) staticcheck ./...
	$(TOOL) staticcheck -tags e2e ./cmd/edgegate ./cmd/edgecat ./cmd/edgesim
	$(TOOL) staticcheck -tags $(RELEASE_TAGS) ./cmd/edgegate

check: lint test

BENCHTIME ?= 1s
COUNT     ?= 1
bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -count $(COUNT) ./aggregate ./gateway/... ./bridge/...

# mosquitto (apt-get install -y mosquitto), a plain mochi broker and
# edgegate (built as released, with RELEASE_TAGS), one after another on the
# same loads from edgesim in its own process (cmd/footprint). The brokers'
# files go under $(DIST)/bench, on this disk rather than a tmpfs, so that
# edgegate's fsyncs cost what they do. FOOTPRINT_FLAGS passes flags
# (footprint -h lists them).
FOOTPRINT_FLAGS ?=
bench-footprint:
	@mkdir -p $(DIST)/bench
	CGO_ENABLED=0 $(GO) build -trimpath -tags $(RELEASE_TAGS) -ldflags "$(LDFLAGS)" -o $(DIST)/bench/ ./cmd/edgegate
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(DIST)/bench/ ./cmd/edgesim ./cmd/devkafka ./cmd/footprint
	$(DIST)/bench/footprint -dir $(DIST)/bench $(FOOTPRINT_FLAGS)

bench-footprint-short:
	$(MAKE) bench-footprint FOOTPRINT_FLAGS="-short $(FOOTPRINT_FLAGS)"

FUZZTIME ?= 60s
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime $(FUZZTIME) ./gateway/payload
	$(GO) test -run '^$$' -fuzz FuzzSparkplug -fuzztime $(FUZZTIME) ./gateway/payload
	$(GO) test -run '^$$' -fuzz FuzzListener -fuzztime $(FUZZTIME) ./gateway
	$(GO) test -run '^$$' -fuzz FuzzRecover -fuzztime $(FUZZTIME) ./bridge/queue
	$(GO) test -run '^$$' -fuzz FuzzStateFile -fuzztime $(FUZZTIME) ./gateway/journal

# The stripped armv7 release build may take this many MiB; make cross
# fails above it. (go tool nm -size -sort size on an unstripped build, and
# cmd/edgegate's deps_test.go and release_test.go, show what it links.)
ARMV7_BUDGET_MIB ?= 12
cross:
	@mkdir -p $(DIST)
	CGO_ENABLED=0 GOOS=linux GOARCH=arm GOARM=6 $(GO) build -trimpath -tags $(RELEASE_TAGS) -ldflags "$(LDFLAGS)" -o $(DIST)/edgegate-linux-armv6 ./cmd/edgegate
	CGO_ENABLED=0 GOOS=linux GOARCH=arm GOARM=7 $(GO) build -trimpath -tags $(RELEASE_TAGS) -ldflags "$(LDFLAGS)" -o $(DIST)/edgegate-linux-armv7 ./cmd/edgegate
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -trimpath -tags $(RELEASE_TAGS) -ldflags "$(LDFLAGS)" -o $(DIST)/edgegate-linux-arm64 ./cmd/edgegate
	@for f in $(DIST)/edgegate-linux-armv6 $(DIST)/edgegate-linux-armv7 $(DIST)/edgegate-linux-arm64; do \
		wc -c < $$f | awk -v f=$$f '{printf "%-32s %6.2f MiB (%d bytes)\n", f, $$1/1048576, $$1}'; done
	@size=$$(wc -c < $(DIST)/edgegate-linux-armv7); budget=$$(( $(ARMV7_BUDGET_MIB) * 1048576 )); \
	if [ $$size -gt $$budget ]; then \
		echo "edgegate-linux-armv7: $$size bytes, over its budget of $(ARMV7_BUDGET_MIB) MiB ($$budget bytes) by $$((size - budget)):"; \
		echo "  find what grew with go tool nm -size -sort size on an unstripped build (README: What an ARM build contains)"; exit 1; \
	else echo "edgegate-linux-armv7: within its budget of $(ARMV7_BUDGET_MIB) MiB, $$((budget - size)) bytes to spare"; fi

# Debian packages: armhf (the ARMv6 build, which Raspberry Pi OS's armhf
# needs for a Pi Zero/1 and runs everywhere else), arm64 and amd64.
DEB_VERSION ?= 0.1.0~git$(shell git rev-parse --short HEAD 2>/dev/null || echo 0)
deb: cross
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(DIST)/edgegate-linux-amd64 ./cmd/edgegate
	@mkdir -p $(DIST)/pkg && cp $(DIST)/edgegate-linux-armv6 $(DIST)/pkg/edgegate
	DEB_ARCH=armhf VERSION=$(DEB_VERSION) $(TOOL) nfpm package --config configs/nfpm.yaml --packager deb --target $(DIST)/
	@mkdir -p $(DIST)/pkg && cp $(DIST)/edgegate-linux-arm64 $(DIST)/pkg/edgegate
	DEB_ARCH=arm64 VERSION=$(DEB_VERSION) $(TOOL) nfpm package --config configs/nfpm.yaml --packager deb --target $(DIST)/
	@mkdir -p $(DIST)/pkg && cp $(DIST)/edgegate-linux-amd64 $(DIST)/pkg/edgegate
	DEB_ARCH=amd64 VERSION=$(DEB_VERSION) $(TOOL) nfpm package --config configs/nfpm.yaml --packager deb --target $(DIST)/
	@ls -l $(DIST)/*.deb | awk '{printf "%-48s %6.1f MiB\n", $$9, $$5/1048576}'

# The timeouts catch a hang, not a slow machine: on a quiet machine the
# four take about 6 min in all, the client matrix (TestClientMatrix:
# paho, python3-paho-mqtt, MQTT.js, mosquitto_pub through restarts and
# connection cuts) up to 6 more, the nemesis about 3; a first ARM build
# (make deb, the qemu tests) compiles the standard library three times
# over.
e2e:
	$(GO) test -tags e2e -count=1 -timeout 35m -run 'E2E|CrashLoop|JournalWriteFailure|DebianPackage|StatusPage|SecurityInterop|SeriesBomb|SparkplugTahuInterop|ClientMatrix' -v ./cmd/edgegate
	$(GO) test -tags e2e -count=1 -timeout 15m -run 'PowerCut' -v ./cmd/edgegate
	$(GO) test -tags e2e -count=1 -timeout 10m -run 'Sink' -v ./cmd/edgecat
	$(GO) test -tags e2e -count=1 -timeout 15m -run 'Soak|ClocksScenarioE2E' -v ./cmd/edgesim
	$(GO) test -tags e2e -count=1 -timeout 10m -run 'Nemesis' -v ./cmd/edgegate
	# The seed that found delivery stopped for good after a Kafka outage
	# (sarama's AbortTxn waiting on results nobody read), replayed.
	$(GO) test -tags e2e -count=1 -timeout 10m -run 'Nemesis' -v ./cmd/edgegate -nemesis.seed 8877554946337487339 -nemesis.time 60s

crash-long:
	$(GO) test -tags e2e -count=1 -timeout 60m -run CrashLoop -v ./cmd/edgegate -long
	$(GO) test -tags e2e -count=1 -timeout 90m -run PowerCut -v ./cmd/edgegate -long

# The standing adversary (cmd/edgegate/nemesis_e2e_test.go): make e2e runs
# it for 150 s with a random seed, printed with the schedule; a failure is
# replayed with its seed (make nemesis NEMESIS_SEED=... NEMESIS_TIME=...:
# the schedule depends on both) and run long by hand (NEMESIS_TIME=1h).
# Needs mosquitto-clients and python3-paho-mqtt (.ci/run).
NEMESIS_TIME  ?= 150s
NEMESIS_SEED  ?= 0
NEMESIS_FLAGS ?=
nemesis:
	$(GO) test -tags e2e -count=1 -timeout 0 -run 'Nemesis' -v ./cmd/edgegate \
		-nemesis.time $(NEMESIS_TIME) -nemesis.seed $(NEMESIS_SEED) $(NEMESIS_FLAGS)

clean:
	rm -rf bin $(DIST)
