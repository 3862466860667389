if __name__ == "__main__":  # not when a spawned helper process imports this module
    from jupyter_portable.interfaces.cli.commands import main

    raise SystemExit(main())
