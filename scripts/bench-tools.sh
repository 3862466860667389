#!/usr/bin/env bash
# restic and rclone for bench/scale.py, from the distribution's packages (Debian/Ubuntu):
# nothing is downloaded at run time besides what apt fetches. Safe to run twice.
set -euo pipefail
missing=()
for tool in restic rclone; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "bench-tools: restic and rclone are installed" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "bench-tools: ${missing[*]} missing and no apt-get here; install them with your package manager" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "bench-tools: run as root (or install sudo) to apt-get install ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
fi
echo "bench-tools: apt-get install -y ${missing[*]}" >&2
if ! $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"; then
    $SUDO apt-get update
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
fi
