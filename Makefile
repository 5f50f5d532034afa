# onnxmlu — one-command set-up, tests, demo and benchmarks.
#   make install   venv + package (editable) + ORT headers + custom-op library (idempotent)
#   make test      the CI test suite
#   make demo      zoo ResNet-18 -> fuse -> check -> latency
#   make bench     benchmark scripts (prints ratios measured side by side)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
LIB    := onnxmlu/_lib/libonnxmlu_ops.so
OUT    ?= out
PYTEST_ARGS ?=

.PHONY: install lib sanitize test test-slow demo bench bench-quick clean

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

test: install
	$(PY) -m pytest -q -n 2 -m "not slow and not browser and not heavy" $(PYTEST_ARGS)
	$(PY) -m pytest -q -m "heavy and not slow" $(PYTEST_ARGS)

test-slow: install
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

demo: install
	@mkdir -p $(OUT)
	$(PY) scripts/demo.py --out $(OUT)

bench: install
	$(PY) scripts/bench_runtime.py
	$(PY) scripts/bench_lstm.py
	$(PY) scripts/bench_planner.py

clean:
	rm -rf $(VENV) onnxmlu/_lib build $(OUT) .pytest_cache
