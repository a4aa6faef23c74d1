"""The operators' dashboard: templates, static files and the SVG chart helper."""
