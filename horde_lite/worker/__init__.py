"""`horde-lite worker`: a long-running bridge between a horde and a model server the volunteer runs.

Modules: `config` (what the worker declares and how it behaves), `horde` (the horde API client,
retries included), `backends/` (one small interface, one module per kind of model server),
`relay` (a streaming chat job's progress posts), `jobs` (one job, start to submit), `runner` (the
pop loop, threads, back-off, signals) and `command` (the click command). docs/reference/worker.md
is the operator's page.
"""
