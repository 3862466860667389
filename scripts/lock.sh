#!/usr/bin/env bash
# `make lock`: refresh the project's own lock files, requirements/py3.X.txt, one for each Python the
# README supports. Each names every package `make demo` and `make test` install (the package's
# dependencies with its test and docs extras, and its build backend) at one version, with the
# SHA-256 of every file of that release; scripts/setup.sh installs exactly those with
# `pip --require-hashes`. pyproject.toml keeps its ranges: users of `pip install` are not pinned.
#
# Run it on purpose (a new dependency, a wanted upgrade), then `make test`, then commit the lock
# files. `make test-latest` shows first what the newest versions would break.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VERSIONS=(3.10 3.11 3.12 3.13)

# uv resolves (it is one of the project's dependencies; a throwaway venv holds it when .venv has none)
UV=.venv/bin/uv
if [ ! -x "$UV" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$PYTHON" -m venv "$tmp/uv" && "$tmp/uv/bin/python" -m pip install -q uv
    UV="$tmp/uv/bin/uv"
fi

# pip's own find-links (where this kind of machine keeps the CPU build of torch) are uv's too, so
# the lock names the files pip will find; uv reads no pip.conf
find_links=()
for dir in $("$PYTHON" -m pip config get global.find-links 2>/dev/null || true); do
    [ -d "$dir" ] && find_links+=(--find-links "$dir")
done

build_in=$(mktemp)
"$PYTHON" - >"$build_in" <<'PY'
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))
PY
# what hatchling asks for besides, to build the editable install (get_requires_for_build_editable)
echo "editables" >>"$build_in"
mkdir -p requirements
for v in "${VERSIONS[@]}"; do
    echo "locking for Python $v -> requirements/py$v.txt"
    "$UV" pip compile pyproject.toml "$build_in" --extra test --extra docs --python-version "$v" \
        --python-platform linux --generate-hashes --no-header --quiet "${find_links[@]}" \
        --constraint requirements/constraints.txt \
        -o "requirements/py$v.txt.new"
    {
        echo "# The lock of jupyter-portable's own environment for Python $v (make lock writes it;"
        echo "# scripts/setup.sh installs it with pip --require-hashes). Do not edit by hand."
        cat "requirements/py$v.txt.new"
    } >"requirements/py$v.txt"
    rm "requirements/py$v.txt.new"
done
rm -f "$build_in"
echo "locked: requirements/py{${VERSIONS[*]// /,}}.txt"
