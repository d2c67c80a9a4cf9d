"""The OpenAI-compatible HTTP server (``specdec serve``): the server and its app (``app``), routes,
request schemas, OpenAI answer formats (``openai``), scheduling of concurrent generations
(``scheduler``), OpenAI-style errors, Prometheus metrics and a load-test client."""
