"""Plots and tables; one module per command."""
