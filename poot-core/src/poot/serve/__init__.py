"""`poot serve`: an OpenAI-compatible HTTP server with continuous batching.

- protocol: request bodies checked into a Generation (or refused with a RequestError)
- engine: the scheduler thread that owns the model and batches every decode step
- text: a sequence's text, UTF-8-safe and cut at its stop strings
- responses: the OpenAI response objects and server-sent event framing
- app: the Starlette routes over one engine

The command is `poot.cli.serve`.
"""
