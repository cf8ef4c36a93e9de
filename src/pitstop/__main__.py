"""`python -m pitstop` is the `pitstop` command."""

from pitstop.cli.app import main

main()
