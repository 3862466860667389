from jupyter_portable.worker.config import main

got = main()
if isinstance(got, int):
    raise SystemExit(got)
from jupyter_portable.worker.daemon import run  # noqa: E402 - the server's imports: only in the agent itself

raise SystemExit(run(got))
