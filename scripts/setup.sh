#!/usr/bin/env bash
# Create .venv at the repo root and install the project with its test extras.
# Installs the Debian packages the tests need first, if any are missing (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

# Debian packages the test suite needs: a real sshd on loopback for the ssh provider, Chromium
# for the browser tests (Playwright drives Debian's Chromium; it downloads no browser), and sudo
# (the twins' Lambda, AWS and GCP machines log in as ubuntu with sudo, as those images do), Slurm
# and munge (a real one-node cluster for the slurm provider), restic and rclone (the peers of the
# small run of bench/scale.py in the suite).
APT_PACKAGES=(openssh-server openssh-client chromium sudo slurm-wlm munge restic rclone)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
    if [ "$(id -u)" -ne 0 ]; then
        echo "error: missing Debian packages: ${missing[*]} (run as root or install them)" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

# Azurite (the Azure Storage emulator) from the npm registry, for the az:// store tests: exactly
# the versions of requirements/azurite/package-lock.json (npm ci). It needs nothing of the steps
# below, so it runs beside them (it mostly waits on the registry); its end is awaited before
# set-up is done, and its failure fails set-up.
azurite=
if [ ! -f .azurite/node_modules/azurite/dist/src/blob/main.js ] \
        || ! cmp -s requirements/azurite/package-lock.json .azurite/package-lock.json; then
    rm -rf .azurite && mkdir -p .azurite
    cp requirements/azurite/package.json requirements/azurite/package-lock.json .azurite/
    (cd .azurite && exec npm ci --no-audit --no-fund --silent) &
    azurite=$!
    trap 'kill "$azurite" 2>/dev/null || true' EXIT  # a step below failed: it is not left running
fi

VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
# The lab extension's npm packages exactly as labextension/yarn.lock names them (the build below
# runs `jlpm install` again; with the lock already met it changes nothing)
jlpm_install() { (cd labextension && PATH="$CURDIR/$VENV/bin:$PATH" jlpm install "$@"); }
CURDIR=$(pwd)
if [ "${PORTABLE_LOCK:-locked}" = latest ]; then
    # make test-latest: the newest versions the ranges of pyproject.toml allow (a separate tree)
    echo "installing the NEWEST versions pyproject.toml allows (not the lock)"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q --upgrade --upgrade-strategy eager -e ".[test,docs]"
else
    # The project's own environment: exactly the lock of this Python, every file checked by its hash;
    # nothing is resolved here (the build backend is in the lock too, so the build is not isolated)
    pyver=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    lock="requirements/py$pyver.txt"
    if [ ! -f "$lock" ]; then
        echo "error: no lock for Python $pyver in requirements/ (the README supports 3.10 to 3.13)" >&2
        exit 1
    fi
    echo "installing from the lock $lock (pip --require-hashes, no resolution)"
    "$VENV/bin/python" -m pip install -q --require-hashes --no-deps -r "$lock"
    "$VENV/bin/python" -m pip check
    jlpm_install --immutable
    PATH="$CURDIR/$VENV/bin:$PATH" "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
fi

# The worker's wheels, once, for this interpreter and for the Pythons the twins' machines run
# (pyenv's 3.10, Debian's 3.11.2, and 3.12/3.13): the tests bootstrap bare machines from this
# folder (JUPYTER_PORTABLE_WHEEL_FIND_LINKS) and never ask a package index themselves.
WHEELHOUSE_PYTHONS=(3.10.13 3.11.2 3.12.1 3.13.0)
if ! ls .wheelhouse/uv-*.whl >/dev/null 2>&1 || [ pyproject.toml -nt .wheelhouse ] \
        || [ jupyter_portable/worker/wheelset.py -nt .wheelhouse ] \
        || [ jupyter_portable/worker/resolve.py -nt .wheelhouse ]; then
    rm -rf .wheelhouse
    "$VENV/bin/python" -m jupyter_portable.worker.bootstrap --wheelhouse .wheelhouse \
        "${WHEELHOUSE_PYTHONS[@]/#/--python=}"
fi
if [ -n "$azurite" ]; then
    wait "$azurite" || { echo "error: npm ci of Azurite in .azurite failed" >&2; exit 1; }
    trap - EXIT
fi
echo "set-up done: $VENV"
