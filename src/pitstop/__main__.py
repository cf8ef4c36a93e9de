"""`python -m pitstop` is the `pitstop` command."""

from pitstop.cli.app import main

if __name__ == "__main__":  # not when a spawned worker process re-imports it
    main()
