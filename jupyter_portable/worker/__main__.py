from jupyter_portable.worker.agent import main

raise SystemExit(main())
