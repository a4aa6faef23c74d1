"""The running horde as every domain sees it: its context (settings, policies in force, metrics, clock,
database), the refusals it raises, its wake-ups and its background tasks."""
