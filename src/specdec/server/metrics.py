"""Prometheus metrics of the server, named as vLLM names them under a ``specdec:`` prefix so that
existing dashboards work (``spec_decode_num_drafts_total`` and friends)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specdec.stats import GenerationStats

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ServerMetrics:
    """One registry per app (tests start several apps in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("specdec:requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("specdec:prompt_tokens", "prompt tokens processed", registry=r)
        self.cached_tokens = Counter("specdec:prompt_tokens_cached", "prompt tokens taken from an earlier "
                                     "prompt's cache", registry=r)
        self.generation_tokens = Counter("specdec:generation_tokens", "tokens generated", registry=r)
        self.latency = Histogram("specdec:e2e_request_latency_seconds", "request latency, arrival to last token",
                                 registry=r, buckets=LATENCY_BUCKETS)
        self.first_token = Histogram("specdec:time_to_first_token_seconds", "arrival to first token",
                                     registry=r, buckets=LATENCY_BUCKETS)
        self.queue = Histogram("specdec:request_queue_time_seconds", "time waiting for a slot",
                               registry=r, buckets=LATENCY_BUCKETS)
        self.running = Gauge("specdec:num_requests_running", "generations in progress", registry=r)
        self.waiting = Gauge("specdec:num_requests_waiting", "requests waiting for a slot", registry=r)
        self.drafts = Counter("specdec:spec_decode_num_drafts", "steps that verified a draft", registry=r)
        self.draft_tokens = Counter("specdec:spec_decode_num_draft_tokens", "draft tokens verified", registry=r)
        self.accepted_tokens = Counter("specdec:spec_decode_num_accepted_tokens", "draft tokens accepted",
                                       registry=r)
        self.accepted_per_pos = Counter("specdec:spec_decode_num_accepted_tokens_per_pos",
                                        "draft tokens accepted at each draft position", ["position"], registry=r)

    def generation(self, stats: GenerationStats) -> None:
        """Count one finished (or abandoned) generation."""
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.cached_tokens.inc(stats.cached_tokens)
        self.generation_tokens.inc(stats.new_tokens)
        self.drafts.inc(stats.draft_steps)
        self.draft_tokens.inc(stats.drafted)
        self.accepted_tokens.inc(stats.accepted)
        for position, n in enumerate(stats.accepted_per_pos):
            self.accepted_per_pos.labels(position=str(position)).inc(n)

    def watch_batch(self, batched) -> None:
        """Count the ticks of a model's batched sequences (:class:`~specdec.backends.base.BatchedSequences`)
        under ``specdec:batch_*``: ticks, the sequences and rows in them, the draft rows verified,
        the ticks that verified any, and the forwards the backend split them into (read when
        scraped; a counter the backend does not keep is left out)."""
        self.registry.register(_BatchCollector(batched))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _BatchCollector:
    """The batch's own counters, read from it when scraped."""

    COUNTERS = (("ticks", "batch_ticks", "ticks (batched forwards) run"),
                ("sequences", "batch_sequences", "sequences stepped in the ticks (a sum over ticks)"),
                ("rows", "batch_rows", "rows decoded in the ticks"),
                ("drafted", "batch_draft_rows", "draft rows verified in the ticks"),
                ("offered", "batch_offered_rows", "draft rows offered to the ticks' joint choice of lengths"),
                ("taken", "batch_taken_rows", "offered draft rows the joint choice verified"),
                ("drafting_ticks", "batch_drafting_ticks", "ticks that verified a draft row"),
                ("paused", "batch_paused_steps", "steps a sequence took without drafting: its offers paused "
                                                 "after shared ticks declined them, or no draft could pay "
                                                 "in a batch of its size"),
                ("forwards", "batch_forwards", "forwards the ticks were split into"),
                ("decode_s", "batch_decode_seconds", "seconds in the ticks' forwards"))

    def __init__(self, batched) -> None:
        self.batched = batched

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        for attribute, name, help_text in self.COUNTERS:
            value = getattr(self.batched, attribute, None)
            if value is not None:
                yield CounterMetricFamily(f"specdec:{name}", help_text, value=float(value))
