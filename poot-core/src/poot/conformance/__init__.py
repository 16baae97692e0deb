"""The backend conformance suite: `pytest --pyargs poot.conformance --poot-backend NAME`."""
