#!/usr/bin/env bash
# Print (one line on stdout) a directory that holds onnxruntime's C/C++ API headers.
#
# onnxruntime's pip wheel ships no headers, so the custom-op library is compiled against
# Debian trixie's libonnxruntime-dev (1.21.0, ORT_API_VERSION 21); the library requests API
# version 21 at run time, which newer runtimes still serve.
#
# Lookup order:
#   1. $ORT_INCLUDE_DIR, if it holds onnxruntime_c_api.h and onnxruntime_cxx_api.h;
#   2. <repo>/custom_ops/third_party/onnxruntime/include: the four headers the library needs,
#      vendored (MIT, licence beside them) and carried by the sdist, so a source build needs
#      no network;
#   3. /usr/include/onnxruntime;
#   4. <repo>/.cache/ort-headers/usr/include/onnxruntime, filled on first use by downloading
#      libonnxruntime-dev with a PRIVATE apt configuration (the system's apt sources, lists
#      and caches are never touched; no root needed).
set -euo pipefail

die() { echo "fetch_ort_headers.sh: error: $*" >&2; exit 1; }

has_headers() {
    [[ -f "$1/onnxruntime_c_api.h" && -f "$1/onnxruntime_cxx_api.h" ]]
}

if [[ -n "${ORT_INCLUDE_DIR:-}" ]]; then
    has_headers "$ORT_INCLUDE_DIR" \
        || die "ORT_INCLUDE_DIR=$ORT_INCLUDE_DIR does not contain onnxruntime_c_api.h and onnxruntime_cxx_api.h"
    (cd "$ORT_INCLUDE_DIR" && pwd)
    exit 0
fi

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if has_headers "$repo_root/custom_ops/third_party/onnxruntime/include"; then
    echo "$repo_root/custom_ops/third_party/onnxruntime/include"
    exit 0
fi

if has_headers /usr/include/onnxruntime; then
    echo /usr/include/onnxruntime
    exit 0
fi

C="$repo_root/.cache/ort-headers"
include_dir="$C/usr/include/onnxruntime"
if has_headers "$include_dir"; then
    echo "$include_dir"
    exit 0
fi

keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -f "$keyring" ]] \
    || die "no onnxruntime headers found and $keyring is missing (not a Debian system?);" \
           "install onnxruntime's C/C++ headers (version >= 1.21) and set ORT_INCLUDE_DIR to their directory"
command -v apt-get >/dev/null && command -v dpkg >/dev/null \
    || die "apt-get/dpkg not available to fetch libonnxruntime-dev; set ORT_INCLUDE_DIR to onnxruntime's include directory"

echo "fetch_ort_headers.sh: fetching Debian trixie libonnxruntime-dev into $C (private apt configuration)" >&2
rm -rf "$C/extract" "$C/dl"
mkdir -p "$C/lists/partial" "$C/cache/archives/partial" "$C/etc/sources.list.d" "$C/dl"
cat > "$C/etc/sources.list.d/trixie.sources" <<SOURCES
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: $keyring
SOURCES

apt_opts=(
    -o Dir::Etc::SourceList=/dev/null
    -o "Dir::Etc::SourceParts=$C/etc/sources.list.d"
    -o "Dir::State::Lists=$C/lists"
    -o "Dir::Cache=$C/cache"
    -o Debug::NoLocking=1
)
log="$C/fetch.log"
apt-get -q "${apt_opts[@]}" update >"$log" 2>&1 \
    || { cat "$log" >&2; die "apt-get update (private trixie source) failed; set ORT_INCLUDE_DIR to use local headers"; }
(cd "$C/dl" && apt-get -q "${apt_opts[@]}" download libonnxruntime-dev) >>"$log" 2>&1 \
    || { cat "$log" >&2; die "apt-get download libonnxruntime-dev failed; set ORT_INCLUDE_DIR to use local headers"; }

debs=("$C"/dl/libonnxruntime-dev_*.deb)
[[ -f "${debs[0]}" ]] || die "libonnxruntime-dev .deb not found after download (see $log)"
# Extract to a staging directory and move into place, so an interrupted run never leaves a
# half-filled cache that the fast path above would accept.
dpkg -x "${debs[0]}" "$C/extract" || die "dpkg -x ${debs[0]} failed"
has_headers "$C/extract/usr/include/onnxruntime" \
    || die "libonnxruntime-dev package has no usr/include/onnxruntime headers"
rm -rf "$C/usr"
mv "$C/extract/usr" "$C/usr"
# The package index (~20 MB) was only needed for this one download.
rm -rf "$C/extract" "$C/dl" "$C/lists" "$C/cache"
echo "$include_dir"
