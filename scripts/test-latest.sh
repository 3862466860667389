#!/usr/bin/env bash
# `make test-latest`: the whole suite against the NEWEST versions pyproject.toml's ranges allow, in a
# separate copy of this tree (.latest/, git-ignored: its own .venv, wheelhouse and lab build), so the
# project's own locked .venv is untouched. It first lists every package whose newest version differs
# from the lock, so a failure can be put down to a named release. Run it before `make lock`.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
lock="requirements/py$pyver.txt"

# the tree as it is now (tracked and untracked files git does not ignore), without the ignored builds
rm -rf .latest/src && mkdir -p .latest/src
git ls-files -z --cached --others --exclude-standard | grep -z -v '^\.latest/' \
    | xargs -0 tar -cf - | tar -xf - -C .latest/src
cd .latest/src
PYTHON="$PYTHON" PORTABLE_LOCK=latest scripts/setup.sh

echo "== what differs from the lock ($lock) =="
.venv/bin/python - "$lock" <<'PY' | tee ../differences.txt
import re, sys
from importlib.metadata import distributions
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
locked = dict(re.findall(r"(?m)^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", open(sys.argv[1]).read()))
locked = {norm(k): v for k, v in locked.items()}
now = {norm(d.metadata["Name"]): d.version for d in distributions() if d.metadata["Name"]}
rows = [(n, locked[n], now[n]) for n in sorted(locked) if n in now and now[n] != locked[n]]
for name, old, new in rows:
    print(f"  {name}: locked {old}, newest {new}")
print(f"{len(rows)} packages newer than the lock")
PY
touch .venv/.installed-stamp
status=0
make --no-print-directory checks || status=$?
if [ "$status" -ne 0 ]; then
    echo "make test-latest: FAILED against the newest versions; the releases that differ from the lock are in .latest/differences.txt" >&2
else
    echo "make test-latest: passed against the newest versions; \`make lock\` may move the lock forward"
fi
exit "$status"
