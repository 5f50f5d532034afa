#!/usr/bin/env bash
# Smoke test of the commands a user runs first, with the Python given as $1 (default .venv's):
# zoo -> fuse --check -> check -> run -> fuse --precision int8 -> check --accuracy, an input
# error, and the schema registration. `make smoke` runs it on .venv (latest versions),
# `make smoke-lowest` on a venv holding the lowest versions pyproject.toml allows.
# Every step has a time limit: onnx 1.19 used to hang at interpreter exit and 1.20-1.22 to
# segfault there, after the work was done -- an exit status is checked, not just the output.
set -uo pipefail
PY=${1:-.venv/bin/python}
# Absolute (without resolving the venv's symlink): every step runs in a scratch folder.
if [[ "$PY" == */* ]]; then PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"; fi
LIMIT=${SMOKE_TIMEOUT:-300}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0

step() {  # step EXPECTED_STATUS DESCRIPTION COMMAND...
    local want=$1 what=$2
    shift 2
    local log="$work/log" status
    (cd "$work" && timeout "$LIMIT" "$@") >"$log" 2>&1
    status=$?
    if [ "$status" -eq "$want" ]; then
        echo "ok    $what"
    else
        echo "FAIL  $what: exit $status, expected $want"
        tail -n 15 "$log" | sed 's/^/      /'
        failed=1
    fi
}

export PYTHONPATH="${PYTHONPATH:-}"
"$PY" -c 'import onnx, onnxruntime, numpy, typer, rich
print("versions: onnx", onnx.__version__, "onnxruntime", onnxruntime.__version__, "numpy", numpy.__version__,
      "typer", typer.__version__, "rich", __import__("importlib.metadata").metadata.version("rich"))'
step 0 "--version"                    "$PY" -m onnxmlu --version
step 0 "zoo mobilenetv2"              "$PY" -m onnxmlu zoo mobilenetv2 m.onnx -q
step 0 "fuse --check"                 "$PY" -m onnxmlu fuse m.onnx f.onnx --check -q
step 0 "check"                        "$PY" -m onnxmlu check m.onnx f.onnx -q
step 0 "run"                          "$PY" -m onnxmlu run f.onnx
step 0 "fuse --precision int8"        "$PY" -m onnxmlu fuse m.onnx q.onnx --precision int8 -q
step 0 "check --accuracy (int8)"      "$PY" -m onnxmlu check m.onnx q.onnx --accuracy 'cosine>=0.99' -q
step 2 "fuse of a missing file"       "$PY" -m onnxmlu fuse missing.onnx x.onnx
step 0 "schema registered, body-typed shape inference, clean exit" "$PY" -c '
import onnx
from onnxmlu.schema import ensure_registered, infer_shapes
ensure_registered()
model = onnx.load("f.onnx")
onnx.checker.check_model(model, full_check=True)
assert infer_shapes(model, strict_mode=True).graph.value_info'
exit $failed
