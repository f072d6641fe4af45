#!/usr/bin/env bash
# Regenerates scripts/startup.order, the order a release build links kin's functions in (see
# build.rs): builds the release binary with a linker map, runs it under a single-stepping tracer
# (scripts/startup-trace.c) through initialize, session/new and one prompt against a loopback
# model, and lists the functions it ran in the order they first ran. Run it after a toolchain or
# dependency update (symbols the file names that a build lacks are skipped, so a stale file only
# costs memory: `kin bench` shows it as idle RSS). The file's first line is the key it was made
# for, SHA-256 of `rustc -V`'s output, Cargo.toml and Cargo.lock: tests/release.rs fails when they
# change without it. Linux x86_64, needs cc, python3 and sha256sum; takes a release build plus a
# few minutes of tracing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$root"
KIN_LINK_MAP="$work/kin.map" cargo build --release
# (After the build, which may have brought Cargo.lock up to date.)
key=$({ "${RUSTC:-rustc}" -V; cat Cargo.toml Cargo.lock; } | sha256sum | cut -d' ' -f1)
cc -O2 -o "$work/trace" scripts/startup-trace.c
# The tracer runs kin from a temporary directory: its path is absolute.
python3 scripts/startup-order.py "$work/trace" "$root/target/release/kin" "$work/kin.map" scripts/startup.order "$key"
