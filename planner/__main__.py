"""`python -m planner` runs the zplan CLI."""

from planner.cli.app import console

console()
