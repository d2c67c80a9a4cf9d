"""The OpenAI-compatible HTTP server (``specdec serve``): FastAPI app, request schemas, scheduling
of concurrent generations, Prometheus metrics and a load-test client."""
