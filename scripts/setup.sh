#!/usr/bin/env bash
# Create .venv at the repo root and install the project with its test extras.
# Installs the Debian packages the tests need first, if any are missing (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

# Debian packages the test suite needs: a real sshd on loopback for the ssh provider, Chromium
# for the browser tests (Playwright drives Debian's Chromium; it downloads no browser), and sudo
# (the twins' Lambda, AWS and GCP machines log in as ubuntu with sudo, as those images do).
APT_PACKAGES=(openssh-server openssh-client chromium sudo)
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

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
.venv/bin/python -m pip install -q -e ".[test,docs]"
# Azurite (the Azure Storage emulator) from the npm registry, for the az:// store tests
if [ ! -f .azurite/node_modules/azurite/dist/src/blob/main.js ]; then
    mkdir -p .azurite
    npm install --no-audit --no-fund --no-save --silent --prefix .azurite azurite@3
fi

# The worker's wheels, once, for this interpreter and for the Pythons the twins' machines run
# (pyenv's 3.10, Debian's 3.11.2, and 3.12/3.13): the tests bootstrap bare machines from this
# folder (JUPYTER_PORTABLE_WHEEL_FIND_LINKS) and never ask a package index themselves.
WHEELHOUSE_PYTHONS=(3.10.13 3.11.2 3.12.1 3.13.0)
if ! ls .wheelhouse/uv-*.whl >/dev/null 2>&1 || [ pyproject.toml -nt .wheelhouse ] \
        || [ jupyter_portable/worker/bootstrap.py -nt .wheelhouse ] \
        || [ jupyter_portable/worker/resolve.py -nt .wheelhouse ]; then
    rm -rf .wheelhouse
    .venv/bin/python -m jupyter_portable.worker.bootstrap --wheelhouse .wheelhouse \
        "${WHEELHOUSE_PYTHONS[@]/#/--python=}"
fi
echo "set-up done: .venv"
