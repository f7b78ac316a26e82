# edgegate: the front door. `make help` lists the targets.

GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
DIST    := dist
CMDS    := edgegate edgesim edgecat devkafka
# staticcheck and nfpm have their own module (tools/go.mod), so that their
# dependencies stay out of the module graph of everyone who imports ours.
TOOL    := $(GO) tool -modfile=tools/go.mod

.PHONY: help build demo test lint check bench fuzz cross deb e2e crash-long clean

help:
	@echo "make demo    first run: in-process Kafka, the gateway and a simulated fleet"
	@echo "make test    unit and integration tests (with the race detector)"
	@echo "make lint    gofmt, go vet, staticcheck"
	@echo "make check   lint + test"
	@echo "make e2e     the built binary with mosquitto_pub, kcat and qemu-user (ARM builds);"
	@echo "             20 SIGKILL cycles under QoS 1 load, then an exact check in Kafka"
	@echo "make crash-long  the same crash loop with 200 cycles"
	@echo "make bench   benchmarks (decode+aggregate, whole-gateway ingest)"
	@echo "make fuzz    fuzz the payload decoder, the live MQTT listener, queue recovery and the state file check, FUZZTIME each (default 60s)"
	@echo "make cross   static stripped binaries for linux arm v6, arm v7, arm64 into $(DIST)/"
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
	$(TOOL) staticcheck ./...
	$(TOOL) staticcheck -tags e2e ./cmd/edgegate ./cmd/edgecat ./cmd/edgesim

check: lint test

BENCHTIME ?= 1s
COUNT     ?= 1
bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -count $(COUNT) ./aggregate ./gateway/... ./bridge/...

FUZZTIME ?= 60s
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime $(FUZZTIME) ./gateway/payload
	$(GO) test -run '^$$' -fuzz FuzzListener -fuzztime $(FUZZTIME) ./gateway
	$(GO) test -run '^$$' -fuzz FuzzRecover -fuzztime $(FUZZTIME) ./bridge/queue
	$(GO) test -run '^$$' -fuzz FuzzStateFile -fuzztime $(FUZZTIME) ./gateway/journal

cross:
	@mkdir -p $(DIST)
	CGO_ENABLED=0 GOOS=linux GOARCH=arm GOARM=6 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(DIST)/edgegate-linux-armv6 ./cmd/edgegate
	CGO_ENABLED=0 GOOS=linux GOARCH=arm GOARM=7 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(DIST)/edgegate-linux-armv7 ./cmd/edgegate
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(DIST)/edgegate-linux-arm64 ./cmd/edgegate
	@ls -l $(DIST)/edgegate-linux-* | awk '{printf "%-32s %6.1f MiB\n", $$9, $$5/1048576}'

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

e2e:
	$(GO) test -tags e2e -count=1 -timeout 10m -run 'E2E|CrashLoop|JournalWriteFailure|DebianPackage|StatusPage|SecurityInterop|SeriesBomb' -v ./cmd/edgegate
	$(GO) test -tags e2e -count=1 -timeout 5m -run 'Sink' -v ./cmd/edgecat
	$(GO) test -tags e2e -count=1 -timeout 10m -run 'Soak' -v ./cmd/edgesim

crash-long:
	$(GO) test -tags e2e -count=1 -timeout 60m -run CrashLoop -v ./cmd/edgegate -long

clean:
	rm -rf bin $(DIST)
