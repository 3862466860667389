from jupyter_portable.interfaces.cli.commands import main

if __name__ == "__main__":  # not when a spawned helper process imports this module
    raise SystemExit(main())
