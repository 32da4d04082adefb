# Thin wrapper over CMake and ctest. The README's two commands: `make run`, `make test`.
BUILD      ?= build
TEST_BUILD ?= build-test
JOBS       ?= $(shell nproc)
LISTEN     ?= 127.0.0.1:8080
DATA_DIR   ?= ./trainyard-data

.PHONY: all deps deps-build deps-test build run test bench demo clean

all: build

deps-build:
	@bash deploy/install-deps.sh --build-only

deps: 
	@bash deploy/install-deps.sh
	@bash tests/setup-npm.sh

build: deps-build
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) --target trainyard trainyard-engine

run: build
	$(BUILD)/bin/trainyard serve --listen $(LISTEN) --data-dir $(DATA_DIR)

demo: build
	$(BUILD)/bin/trainyard demo

# `make test` also builds the Release binaries `make run` uses, so a warning
# that only an optimised build raises cannot break the README's first command.
test: deps build
	@cmake -S . -B $(TEST_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTY_SANITIZE=ON >/dev/null
	@cmake --build $(TEST_BUILD) -j $(JOBS)
	@cd $(TEST_BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

bench: deps build
	@bash bench/run-all.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(TEST_BUILD)
