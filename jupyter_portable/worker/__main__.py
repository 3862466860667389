from jupyter_portable.worker.daemon import main

raise SystemExit(main())
