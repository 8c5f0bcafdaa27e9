#!/usr/bin/env bash
# Install what Cubicle needs on Debian 12 and skip what is already there:
# the desktop's packages (images/packages.txt), the sandbox tools, and a virtualenv.
#   scripts/bootstrap.sh          for running the service
#   scripts/bootstrap.sh test     also what the tests and benchmarks use
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}

# The sandbox: bwrap, slirp4netns; a capped disk per desktop (mkfs.ext4; fuse2fs for a
# service that is not root); the seccomp filter (libseccomp's Python binding).
host_packages=(bubblewrap slirp4netns util-linux mount e2fsprogs fuse2fs fuse3 python3-seccomp
               procps psmisc python3 python3-venv python3-dev gcc)
# Tests and benchmarks; the cgroup v2 test boots Debian's cloud kernel under QEMU (below);
# the fork test makes an XFS data directory (reflinks: copy-on-write disks).
test_packages=(xdotool scrot x11vnc novnc python3-tk busybox-static linux-image-cloud-amd64 xfsprogs)
# The microvm runtime (CUBICLE_RUNTIME=microvm, and the tests): QEMU, and what builds its image.
microvm_packages=(qemu-system-x86 qemu-utils mmdebstrap e2fsprogs passt)

packages=($(grep -v -e '^#' -e '^$' images/packages.txt) "${host_packages[@]}")
[ "$mode" = test ] && packages+=("${test_packages[@]}")
if [ "$mode" = test ] || [ "${CUBICLE_RUNTIME:-local}" = microvm ]; then
    packages+=("${microvm_packages[@]}")
fi

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "==> installing ${#missing[@]} Debian packages: ${missing[*]}"
    sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -q
    $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
else
    echo "==> Debian packages: all ${#packages[@]} installed"
fi

# E2B's JavaScript SDK, which the tests drive against the service (tests/e2b_js).
if [ "$mode" = test ]; then
    if ! command -v npm >/dev/null; then
        echo "==> installing npm"
        sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
        $sudo apt-get install -y -q --no-install-recommends npm
    fi
    if [ ! -d tests/e2b_js/node_modules ] || [ tests/e2b_js/package-lock.json -nt tests/e2b_js/node_modules ]; then
        echo "==> installing E2B's JavaScript SDK for the tests (npm ci)"
        (cd tests/e2b_js && npm ci --no-audit --no-fund --loglevel=error)
    else
        echo "==> E2B's JavaScript SDK: installed"
    fi
fi

# Debian's interpreter, so python3-gi (AT-SPI) is importable from the virtualenv.
if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv"
    /usr/bin/python3 -m venv --system-site-packages .venv
fi
extras="[server,vendors]"; [ "$mode" = test ] && extras="[test,osworld]"
# OSWorld's package, for its controllers and metrics (tests): without its dependency list,
# which would pull torch; [osworld] lists what those parts import.
osworld_env="desktop-env==1.0.2"
stamp=".venv/.installed-$(cat pyproject.toml | sha256sum | cut -c1-16)$extras"
if [ ! -f "$stamp" ]; then
    echo "==> installing Python packages${extras:+ with $extras}"
    .venv/bin/pip install -q --disable-pip-version-check --upgrade pip
    .venv/bin/pip install -q --disable-pip-version-check -e ".$extras"
    [ "$mode" = test ] && .venv/bin/pip install -q --disable-pip-version-check --no-deps "$osworld_env"
    touch "$stamp"
else
    echo "==> Python packages: up to date"
fi
