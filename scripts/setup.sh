# setup.sh — sourced by scripts/demo, scripts/test and scripts/bench: installs
# what a fresh Debian machine lacks (when run as root), then configures and
# builds Kiln.  Functions only; the caller decides what to build.
set -euo pipefail

KILN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KILN_JOBS="${KILN_JOBS:-$(nproc 2>/dev/null || echo 2)}"

# Debian packages Kiln builds and tests with
KILN_APT_PACKAGES=(build-essential cmake pkg-config libopenblas-dev libxxhash-dev uthash-dev
  libgccjit-12-dev zlib1g-dev
  python3 clang-format # scripts/test checks the layers (scripts/check-layers) and
  # the tree against .clang-format (version 14, Debian 12)
  openmpi-bin # data-parallel training: mpirun and libmpi, loaded at run time
  ruby-dev rake rake-compiler ruby-minitest) # the Ruby gem (bindings/ruby)

kiln_missing_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  echo "${missing[@]:-}"
}

kiln_install_packages() {
  local missing
  missing="$(kiln_missing_packages "$@")"
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "kiln: missing Debian packages: $missing" >&2
    echo "kiln: run as root, or install them: sudo apt-get install $missing" >&2
    return 1
  fi
  echo "kiln: installing $missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

# kiln_build DIR [cmake args...]: configure (once) and build into DIR
kiln_build() {
  local dir="$1"
  shift
  cmake -S "$KILN_ROOT" -B "$dir" "$@" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log" >&2; return 1; }
  cmake --build "$dir" -j "$KILN_JOBS" >"$dir.build.log" 2>&1 ||
    { grep -E "error|Error" -A3 "$dir.build.log" | head -60 >&2; return 1; }
  # programs run from a build tree name its compiler helper: the library
  # looks only where it is installed (DESIGN §11)
  if [ -z "${KILN_JITC:-}" ] && [ -x "$dir/kiln-jitc" ]; then export KILN_JITC="$dir/kiln-jitc"; fi
}
