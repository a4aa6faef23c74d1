"""The data layer: models, per-dialect SQL constructs, the engine. Imports nothing above it."""
