"""The backend conformance suite, shipped with poot-core as a pytest plugin.

    pytest --pyargs poot.conformance --poot-backend NAME [--poot-support PATH] [--poot-perf]
    poot conformance NAME [--support [PATH]] [--perf]

Modules: `cases` (every op x dtype x shapes, composites, packed formats), `model` (a real
model's graph op by op), `inputs` and `domains` (seeded inputs, edge values planted),
`compare` (NMSE, exact bits, NaN/Inf rules), `runner` (plan + Executor with guarded results,
replay), `target` and `session` (the backend device under test), `report` (summary,
perf table, support matrix), `roles` (the suite's slot roles), `plugin` (the pytest11
entry: options and the report header), `conftest` and `test_*` (the suite).
docs/backend-guide.md says what each check means for a backend author.
"""
