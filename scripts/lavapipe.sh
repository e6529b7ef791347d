#!/usr/bin/env bash
# A CPU Vulkan device for the worker's GPU code path (CubeCL's Vulkan runtime):
# Mesa's lavapipe from Debian trixie-backports (Mesa 26.1.6 on LLVM 19), in a
# Debian trixie root of its own made by debootstrap, whose loader, C library,
# Vulkan loader and driver the worker runs with (scripts/lavapipe-run). The
# host's packages are not touched. Every older lavapipe tried segfaults inside
# the driver on CubeCL's first kernels: bookworm's (Mesa 22.3.6), bookworm-
# backports' and trixie's (Mesa 25.0.7, on LLVM 15 and 19); Mesa 26 runs them
# (docs/gpu.md).
#
#   scripts/lavapipe.sh          make the root (idempotent), print its path
#
# The root is $SWEEP_VULKAN_ROOT, by default /opt/sweep-lavapipe (about 500 MB,
# a minute or two to make). Needs root (apt, debootstrap).
set -euo pipefail

# The Debian archive this machine's own apt sources name for its release (the
# mirror it already installs from; nothing here names one): the site of the
# index target whose suite is the release's codename.
debian_mirror() {
    local codename site
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}")
    site=$(apt-get indextargets --format '$(SITE) $(RELEASE)' 'Identifier: Packages' |
        awk -v c="$codename" '$2 == c { print $1; exit }')
    [ -n "$site" ] || {
        echo "error: no apt source for Debian $codename (apt-get indextargets); run apt-get update or add one" >&2
        exit 1
    }
    echo "$site"
}

root=${SWEEP_VULKAN_ROOT:-/opt/sweep-lavapipe}
icd=$root/usr/share/vulkan/icd.d/lvp_icd.json
if [ ! -f "$icd" ] || [ ! -f "$root/.complete" ]; then
    if ! command -v debootstrap >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    fi
    mirror=$(debian_mirror)
    echo "making a Debian trixie root with lavapipe (Mesa 26 from trixie-backports) in $root, the CPU Vulkan device of the GPU tests" >&2
    rm -rf "$root"
    log=${TMPDIR:-/tmp}/sweep-lavapipe-debootstrap.log
    {
        debootstrap --variant=minbase --include=libvulkan1,vulkan-tools trixie "$root" "$mirror" &&
            echo "deb $mirror trixie-backports main" >"$root/etc/apt/sources.list.d/backports.list" &&
            chroot "$root" apt-get update -qq &&
            chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t trixie-backports mesa-vulkan-drivers
    } >"$log" 2>&1 || { tail -20 "$log" >&2; exit 1; }
    touch "$root/.complete"
fi
echo "$root"
