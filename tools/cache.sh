# Sourced by tools/build-*.sh: the cache every Go-built tool shares. Not executable on its own.
# A tool is built once per version and per content of its tools/<name>/go.mod + go.sum, into
#   ${SLUICEWAY_CACHE:-~/.cache/sluiceway}/<name>-<version>-<12 hex of sha256(go.mod go.sum)>/bin
# The hash is of the content only (not the checkout path), so every clone shares the cache.

# module_version DIR MODULE: the version of MODULE that DIR/go.mod requires (both go.mod forms:
# `require MODULE vX` and a line inside a `require (...)` block).
module_version() {
  awk -v m="$2" '($1=="require" && $2==m) {print $3; exit}
                 ($1==m && $2 ~ /^v[0-9]/) {print $2; exit}' "$1/go.mod"
}

# cache_bin NAME VERSION DIR: the bin directory of that build.
cache_bin() {
  local sum
  sum=$(cat "$3/go.mod" "$3/go.sum" | sha256sum | cut -c1-12)
  echo "${SLUICEWAY_CACHE:-$HOME/.cache/sluiceway}/$1-$2-$sum/bin"
}

# require_go DIR: exit with a message naming what to install unless `go` is on PATH and at least the
# version DIR/go.mod's `go` line asks for (the builds run with GOTOOLCHAIN=local: no download).
require_go() {
  local want have
  want=$(awk '$1=="go" {print $2; exit}' "$1/go.mod")
  if ! command -v go >/dev/null 2>&1; then
    echo "$(basename "$0"): Go >= $want is needed to build $(basename "$1") (none on PATH): install Go $want or newer" >&2
    exit 1
  fi
  have=$(go env GOVERSION | sed 's/^go//')
  if [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -n1)" != "$want" ]; then
    echo "$(basename "$0"): Go >= $want is needed to build $(basename "$1"), this machine has $have: install Go $want or newer (GOTOOLCHAIN=local: nothing is downloaded)" >&2
    exit 1
  fi
}

# cache_lookup OUT FLAG BINARY...: with FLAG --dir print OUT and exit 0 if every BINARY is there,
# 1 if not (never builds); without it print OUT and exit 0 when they are all there. Otherwise
# return, with OUT.tmp created for the build.
cache_lookup() {
  local out=$1 flag=$2 b ok=1
  shift 2
  for b in "$@"; do [ -x "$out/$b" ] || ok=0; done
  if [ "$flag" = "--dir" ]; then
    echo "$out"
    [ "$ok" = 1 ] && exit 0
    exit 1
  fi
  if [ "$ok" = 1 ]; then echo "$out"; exit 0; fi
  require_go "$here"  # every tools/build-*.sh sets here= to its module folder
  mkdir -p "$out.tmp"
  export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0
}

# cache_commit OUT: move the finished build into place and print OUT.
cache_commit() {
  rm -rf "$1"
  mv "$1.tmp" "$1"
  echo "$1"
}
