#!/usr/bin/env bash
# Installs what building and testing chi needs on a fresh Debian 12, and nothing else:
# the toolchain, the library's dependencies, doctest, clang for the fuzz harnesses, and the
# HIP packages for the hipcc compile check. Idempotent: when everything is present it changes
# nothing and needs no network. Run as root, or as a user who may sudo.
set -euo pipefail

packages=(
  build-essential cmake ninja-build python3 pkg-config   # toolchain and build tools
  libboost-context-dev                                   # fibers
  libzmq3-dev cppzmq-dev                                 # ZeroMQ transport
  libyaml-cpp-dev                                        # runtime configuration
  doctest-dev                                            # unit tests
  clang-15                                               # libFuzzer harnesses (tests/fuzz)
  hipcc libamdhip64-dev rocm-device-libs                 # hip_compile_check
)

# True when dpkg reports the package fully installed.
installed() {
  [[ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" == "installed" ]]
}

missing=()
for p in "${packages[@]}"; do
  installed "$p" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"

if [[ "$(id -u)" == 0 ]]; then
  as_root=(env DEBIAN_FRONTEND=noninteractive)
elif command -v sudo >/dev/null; then
  as_root=(sudo env DEBIAN_FRONTEND=noninteractive)
else
  echo "install-deps: need root or sudo to install: ${missing[*]}" >&2
  exit 1
fi

# The package lists are refreshed only when some missing package has no install
# candidate (fresh image with empty lists, or lists older than the archive).
needs_update=0
for p in "${missing[@]}"; do
  candidate="$(apt-cache policy "$p" 2>/dev/null | awk '/Candidate:/ {print $2}')"
  if [[ -z "$candidate" || "$candidate" == "(none)" ]]; then
    needs_update=1
    break
  fi
done
if ((needs_update)); then
  "${as_root[@]}" apt-get update -q
fi
"${as_root[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"

for p in "${missing[@]}"; do
  installed "$p" || { echo "install-deps: $p did not install" >&2; exit 1; }
done
echo "install-deps: done"
