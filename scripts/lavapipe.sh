#!/usr/bin/env bash
# A CPU Vulkan device for the worker's GPU code path (CubeCL's Vulkan runtime):
# Mesa's lavapipe as Debian trixie ships it (Mesa 25.0.7 on LLVM 19), in a
# Debian root of its own made by debootstrap, whose loader, C library, Vulkan
# loader and driver the worker runs with (scripts/lavapipe-run). The host's
# packages are not touched. Bookworm's lavapipe, its own (Mesa 22.3.6) and
# backports' (Mesa 25.0.7), both on LLVM 15, segfault inside
# vkCreateComputePipelines on CubeCL's first kernels (docs/gpu.md); LLVM 19's
# runs them.
#
#   scripts/lavapipe.sh          make the root (idempotent), print its path
#
# The root is $SWEEP_VULKAN_ROOT, by default /opt/sweep-lavapipe (about 500 MB,
# a minute or two to make). Needs root (apt, debootstrap).
set -euo pipefail
root=${SWEEP_VULKAN_ROOT:-/opt/sweep-lavapipe}
icd=$root/usr/share/vulkan/icd.d/lvp_icd.json
if [ ! -f "$icd" ] || [ ! -f "$root/.complete" ]; then
    if ! command -v debootstrap >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    fi
    echo "making a Debian trixie root with lavapipe (Mesa 25, LLVM 19) in $root, the CPU Vulkan device of the GPU tests" >&2
    rm -rf "$root"
    debootstrap --variant=minbase --include=mesa-vulkan-drivers,libvulkan1,vulkan-tools \
        trixie "$root" http://deb.debian.org/debian >"${TMPDIR:-/tmp}/sweep-lavapipe-debootstrap.log" 2>&1 \
        || { tail -20 "${TMPDIR:-/tmp}/sweep-lavapipe-debootstrap.log" >&2; exit 1; }
    touch "$root/.complete"
fi
echo "$root"
