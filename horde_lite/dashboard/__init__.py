"""The operators' dashboard in one package: its routes (routes.py), the queries behind its panels
(queries.py), each panel's context (render.py), the SVG chart helper (svg.py), templates and static
files."""
