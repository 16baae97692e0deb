"""`poot serve`'s GET /metrics, in the Prometheus text format (prometheus-client).

Two kinds of figures:
- observed as they happen: HTTP requests by route and status (the app counts each response
  it starts), time to first token (from the request's submission to its first sampled
  token) and inter-token latency (between a sequence's consecutive tokens), the latter two
  through the engine's hooks `queued(job)` and `token(job)`;
- read from `Engine.stats()` at each scrape, so the engine keeps one set of books: token
  counters, sequence outcomes, KV blocks used and free, running and queued requests, and the
  prefix cache's figures. The prefix cache (poot.runtime.prefix_cache) feeds its stats keys
  `prefix_cache_queried_tokens`, `prefix_cache_hit_tokens` and `prefix_cache_blocks`; a
  scrape turns them into `poot_prefix_cache_{queried,hit}_tokens_total` (the hit rate is
  the ratio of their rates) and `poot_prefix_cache_blocks`, and leaves them out while the
  cache is off. docs/serving.md lists every metric.

The engine holds `QUIET` (no prometheus-client needed) until the app installs a
`ServerMetrics`; its hooks run on the engine's thread, a scrape on the app's.
"""
from __future__ import annotations

import time
import weakref

from poot.optional import require

#: time to first token buckets (seconds): a prompt on the CPU takes seconds, on a GPU ms
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: inter-token latency buckets (seconds)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: engine counters exposed as Prometheus counters: stats key -> (name, help)
COUNTERS = {
    "prompt_tokens": ("poot_prompt_tokens", "prompt tokens of admitted requests"),
    "generated_tokens": ("poot_generated_tokens", "tokens generated"),
    "prefix_cache_queried_tokens": ("poot_prefix_cache_queried_tokens",
                                    "prompt tokens looked up in the prefix cache"),
    "prefix_cache_hit_tokens": ("poot_prefix_cache_hit_tokens",
                                "prompt tokens found in the prefix cache (not prefilled)"),
}
#: speculative decoding's counters: key of stats' "speculation" -> (name, help)
SPECULATION = (
    ("proposed", "poot_speculative_proposed_tokens",
     "tokens proposed to verification steps (prompt lookup or a request's prediction)"),
    ("accepted", "poot_speculative_accepted_tokens",
     "proposed tokens the verification steps accepted"),
    ("verify_steps", "poot_speculative_verify_steps", "verification steps run"))
#: how sequences ended: stats key -> the `outcome` label
OUTCOMES = {"finished": "finished", "cancelled": "cancelled", "rejected": "rejected",
            "failed": "failed"}


class Quiet:
    """The hooks of an engine no one scrapes: nothing is recorded."""

    def queued(self, job) -> None:
        pass

    def token(self, job) -> None:
        pass


QUIET = Quiet()


class ServerMetrics(Quiet):
    """The registry GET /metrics renders, over one engine."""

    def __init__(self, engine):
        prom = require("prometheus_client", "prometheus-client")
        self.registry = prom.CollectorRegistry()
        self.requests = prom.Counter(
            "poot_http_requests", "HTTP requests answered, by route and status",
            ["route", "status"], registry=self.registry)
        self.ttft = prom.Histogram(
            "poot_time_to_first_token_seconds",
            "from a request's submission to its first generated token",
            buckets=TTFT_BUCKETS, registry=self.registry)
        self.itl = prom.Histogram(
            "poot_inter_token_latency_seconds", "between consecutive tokens of a sequence",
            buckets=ITL_BUCKETS, registry=self.registry)
        self.registry.register(_EngineCollector(engine))
        # the server process's own figures (process_resident_memory_bytes, open fds, CPU
        # seconds), as prometheus-client's default registry has them: a leak shows here
        prom.ProcessCollector(registry=self.registry)
        # job -> the time of its submission or its last token; weak, so a job that leaves
        # in any way takes its entry with it
        self._last: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._started: weakref.WeakSet = weakref.WeakSet()
        self._content_type = prom.CONTENT_TYPE_LATEST
        self._generate = prom.generate_latest

    def queued(self, job) -> None:
        self._last[job] = time.perf_counter()

    def token(self, job) -> None:
        now = time.perf_counter()
        before = self._last.get(job)
        self._last[job] = now
        if before is None:
            return
        if job in self._started:
            self.itl.observe(now - before)
        else:
            self._started.add(job)
            self.ttft.observe(now - before)

    def answered(self, route: str, status: int) -> None:
        self.requests.labels(route, str(status)).inc()

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return self._generate(self.registry), self._content_type


class _EngineCollector:
    """The engine's own books, read at each scrape."""

    def __init__(self, engine):
        self.engine = engine
        core = require("prometheus_client.core", "prometheus-client")
        self.Counter, self.Gauge = core.CounterMetricFamily, core.GaugeMetricFamily

    def collect(self):
        s = self.engine.stats()
        for key, (name, text) in COUNTERS.items():
            if key in s:
                yield self.Counter(name, text, value=s[key])
        outcomes = self.Counter("poot_sequences", "requests that ended, by how",
                                labels=["outcome"])
        for key, outcome in OUTCOMES.items():
            outcomes.add_metric([outcome], s[key])
        yield outcomes
        blocks = self.Gauge("poot_kv_blocks", "KV pool blocks, by state (used: held by "
                            "a sequence or the prefix cache)", labels=["state"])
        blocks.add_metric(["free"], s["free_blocks"])
        blocks.add_metric(["used"], s["pool_blocks"] - s["free_blocks"])
        yield blocks
        yield self.Gauge("poot_running_requests", "sequences in the batch", value=s["active"])
        yield self.Gauge("poot_queued_requests", "requests waiting for a batch row",
                         value=s["queued"])
        spec = s["speculation"]
        for key, name, text in SPECULATION:
            yield self.Counter(name, text, value=spec[key])
        if "prefix_cache_blocks" in s:
            yield self.Gauge("poot_prefix_cache_blocks", "KV blocks the prefix cache holds",
                             value=s["prefix_cache_blocks"])
