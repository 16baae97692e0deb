"""One module per pass; each exposes `run(graph, ctx) -> Graph`."""
