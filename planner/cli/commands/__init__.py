"""Thin typer commands; each calls one library function and renders with planner.report."""
