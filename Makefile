# Thin wrapper over CMake and ctest. The README's two commands: `make run`, `make test`.
# `make install` puts trainyard and trainyard-engine in $(DESTDIR)$(PREFIX)/bin.
BUILD      ?= build
TEST_BUILD ?= build-test
JOBS       ?= $(shell nproc)
LISTEN     ?= 127.0.0.1:8080
DATA_DIR   ?= ./trainyard-data
PREFIX     ?= /usr/local
DESTDIR    ?=
# Where `make run`'s jobs may read: the README's tour and `make demo` write
# their datasets under /tmp. A development setting; the server's own
# default is DATA_DIR/inputs only (docs/server.md, "Roots").
RUN_ROOTS  ?= /tmp:$(abspath $(DATA_DIR))/inputs

.PHONY: all deps deps-build deps-test build run test bench demo fuzz format install install-only clean

all: build

deps-build:
	@bash deploy/install-deps.sh --build-only

deps: 
	@bash deploy/install-deps.sh
	@bash tests/setup-npm.sh

# Quiet: a summary and the binaries' paths; the CMake output goes to
# $(BUILD)/build.log and is shown when the build fails (deploy/build.sh).
build: deps-build
	@bash deploy/build.sh $(BUILD) Release $(JOBS) trainyard trainyard-engine

run: build
	@echo "CLI:       $(abspath $(BUILD))/bin/trainyard (\`make install\` puts it on PATH; or export PATH=\"$(abspath $(BUILD))/bin:\$$PATH\")"
	@echo "dashboard: http://$(LISTEN)/  (Ctrl-C stops the server)"
	@exec $(BUILD)/bin/trainyard serve --listen $(LISTEN) --data-dir $(DATA_DIR) --allowed-roots $(RUN_ROOTS)

demo: build
	@$(BUILD)/bin/trainyard demo

# PREFIX (default /usr/local; root needed there: sudo make install) and
# DESTDIR (a staging root for packages) as usual. deploy/CMakeLists.txt says
# what is installed: bin/trainyard, bin/trainyard-engine beside it (where
# `trainyard serve` looks), and lib/systemd/system/trainyard.service with
# ExecStart under $(PREFIX)/bin.
install: build
	@$(MAKE) --no-print-directory install-only

# Installs what $(BUILD) holds, without building it first.
install-only:
	@DESTDIR="$(DESTDIR)" cmake --install $(BUILD) --prefix "$(PREFIX)" >$(BUILD)/install.log 2>&1 || \
	  { cat $(BUILD)/install.log; exit 1; }
	@sed -n 's/^-- Installing: /installed /p; s/^-- Up-to-date: /up to date /p' $(BUILD)/install.log
	@case ":$$PATH:" in *":$(PREFIX)/bin:"*) echo "trainyard is on your PATH: try trainyard --help";; \
	  *) echo "note: $(PREFIX)/bin is not on your PATH; run $(PREFIX)/bin/trainyard, or add it";; esac

# `make test`: packages, the Release binaries `make run` uses (so a warning
# that only an optimised build raises cannot break the README's first
# command), the sanitizer build and ctest -- one line a stage, the failures
# in full and ctest's summary; each stage's whole output is in a log under
# $(TEST_BUILD) (deploy/test.sh).
test:
	@bash deploy/test.sh $(BUILD) $(TEST_BUILD) $(JOBS)

# Longer fuzzing than `make test`'s 60 s per target (docs/fuzzing.md); the
# corpus grows in $(FUZZ_BUILD)/corpus across runs.
FUZZ_SECONDS ?= 600
FUZZ_BUILD   ?= build-fuzz
fuzz:
	@bash deploy/install-deps.sh
	@bash tests/fuzz/fuzz.sh all $(FUZZ_BUILD) $(FUZZ_SECONDS) $(JOBS)

# clang-format over every tracked C file (.clang-format: 100 columns); the
# ctest style.clang_format fails `make test` on a file this would change.
format:
	@bash deploy/format.sh

bench: deps build
	@bash bench/run-all.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(TEST_BUILD) $(FUZZ_BUILD)
