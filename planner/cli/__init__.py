"""Command line and rendering: the `zplan` typer app (`app`), one thin module per command
(`commands`), and the rich / JSON rendering of every result (`report`)."""
