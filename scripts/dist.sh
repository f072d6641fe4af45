#!/usr/bin/env bash
# Packages one built kin binary as a release archive plus its checksum file:
#   OUTDIR/kin-TARGET.tar.gz         kin (mode 755) and README.md at the archive root
#   OUTDIR/kin-TARGET.tar.gz.sha256  "<sha256>  kin-TARGET.tar.gz" (sha256sum -c format)
# The release workflow (.github/workflows/release.yml) runs it once per target; tests/release.rs
# runs it on a local build and checks the layout, so the two cannot drift.
# usage: scripts/dist.sh TARGET BINARY OUTDIR
set -euo pipefail
if [ $# -ne 3 ]; then
  echo "usage: scripts/dist.sh TARGET BINARY OUTDIR" >&2
  exit 2
fi
target=$1 bin=$2 out=$3
root=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$bin" ] || { echo "dist: $bin is not an executable" >&2; exit 1; }
mkdir -p "$out"
name="kin-$target.tar.gz"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
install -m 755 "$bin" "$stage/kin"
install -m 644 "$root/README.md" "$stage/README.md"
tar -C "$stage" --owner=0 --group=0 --numeric-owner -czf "$out/$name" kin README.md 2>/dev/null \
  || tar -C "$stage" -czf "$out/$name" kin README.md   # bsdtar (macOS) has no --owner
cd "$out"
if command -v sha256sum >/dev/null; then sha256sum "$name"; else shasum -a 256 "$name"; fi > "$name.sha256"
echo "$out/$name"
