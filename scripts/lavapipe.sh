#!/usr/bin/env bash
# A CPU Vulkan device for the worker's GPU code path (CubeCL's Vulkan runtime):
# Mesa's lavapipe from Debian bookworm-backports (Mesa 25), with the Vulkan
# loader and vulkaninfo. Bookworm's own lavapipe (Mesa 22.3.6) segfaults in
# vkCreateComputePipelines on CubeCL's first matmul kernel (docs/gpu.md).
# Idempotent; sourced or run by scripts/test.sh. Needs root (apt).
set -euo pipefail
if dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null | grep -q '^2[5-9]\.'; then
    exit 0
fi
. /etc/os-release
if [ "${VERSION_CODENAME:-}" = bookworm ]; then
    list=/etc/apt/sources.list.d/bookworm-backports.list
    [ -f "$list" ] || echo "deb http://deb.debian.org/debian bookworm-backports main" > "$list"
    target=(-t bookworm-backports)
else
    target=()   # trixie and later ship Mesa 25 themselves
fi
echo "installing lavapipe (mesa-vulkan-drivers ${target[*]:-}), the CPU Vulkan device of the GPU tests"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${target[@]}" mesa-vulkan-drivers libvulkan1 vulkan-tools >/dev/null
