#!/usr/bin/env bash
# gather_deps.sh — fills .gpu-deps (ignored by git) with what run_checks.sh builds from on
# a GPU machine whose image lacks it: OpenSSL's libcrypto headers (openssl/include) and
# GoogleTest's source (googletest).  Run it on a Debian/Ubuntu machine after
# scripts/setup.sh (libssl-dev, libgtest-dev), then send .gpu-deps along with the tree:
#
#   bash tests/gpu/gather_deps.sh && echo /.gpu-deps/ >> .git/info/exclude
#
# run_checks.sh uses each part only where the machine has none of its own, and links
# against the machine's own libcrypto.so.3 (the headers of OpenSSL 3 are compatible).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEPS=${RUCCL_GPU_DEPS:-.gpu-deps}
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
[ -f /usr/include/openssl/evp.h ] || { echo "gather_deps: no /usr/include/openssl (apt-get install libssl-dev)" >&2; exit 1; }
[ -f /usr/src/googletest/CMakeLists.txt ] || { echo "gather_deps: no /usr/src/googletest (apt-get install libgtest-dev)" >&2; exit 1; }
rm -rf "$DEPS/openssl" "$DEPS/googletest" "$DEPS/gtest-build" "$DEPS/gtest-install"
mkdir -p "$DEPS/openssl/include/openssl"
cp -r /usr/include/openssl/. "$DEPS/openssl/include/openssl/"
# Debian keeps the configuration headers under the multiarch directory
if [ -d "/usr/include/$multiarch/openssl" ]; then cp -r "/usr/include/$multiarch/openssl/." "$DEPS/openssl/include/openssl/"; fi
cp -r /usr/src/googletest "$DEPS/googletest"
du -sh "$DEPS"
