#!/usr/bin/env bash
# Build prerequisites on a fresh Debian machine: Rust must already be installed
# (rustup); ssh2 builds libssh2 against OpenSSL, found with pkg-config; the
# report's and explain's plots draw their text with a TrueType font (DejaVu);
# jq reads cargo's JSON messages in scripts/test.sh.
# Sourced by scripts/demo.sh and scripts/test.sh.
export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v cargo >/dev/null; then
    echo "error: cargo not found; install Rust (rustup) first" >&2
    exit 1
fi
need=()
for pkg in pkg-config libssl-dev fonts-dejavu-core jq; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "installing build prerequisites: ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
