from jupyter_portable.interfaces.cli.commands import main

raise SystemExit(main())
