"""Views of a sweep's summary: the compact terminal table, rich tables, Markdown and plots (data in, text or PNG out)."""
