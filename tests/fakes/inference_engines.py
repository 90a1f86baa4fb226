"""Inference engines' /metrics as each engine writes it, with tokens growing at known rates.

One aiohttp app serves every engine under its own path (``/vllm/metrics``,
``/nim/v1/metrics``, ...); each path stands for one engine pod. The names, types, labels
and HELP texts are those of the engines' own code and documentation:

- vLLM v1 (0.10): prometheus_client families with labels ``model_name`` and ``engine``,
  counters as ``_total`` and ``_created``, the KV cache under its new and deprecated names;
- SGLang: ``sglang:`` families, the tokenizer's with ``model_name``, the scheduler's with
  ``model_name, engine_type, tp_rank, pp_rank, moe_ep_rank``;
- TGI (Rust, metrics-exporter-prometheus): per-request histograms without a model label;
- Triton with the TensorRT-LLM backend (C++, prometheus-cpp): ``model`` and ``version``
  labels, the backend's ``nv_llm_*_token_len`` histograms and KV-cache block gauges;
- NIM for LLMs: vLLM's names without the prefix, at /v1/metrics.

Counters are ``floor(rate x seconds since start)`` at the moment of the scrape, so a
test knows how many tokens any span of time held. ``scrape_jobs`` gives Prometheus one
scrape config per engine, attaching the pod's namespace and pod (and, for TGI, a model
name from a pod label) by the relabelling docs/INFERENCE.md gives for Kubernetes pods.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


@dataclass
class Tokens:
    """Tokens a second of one model, prompt and generated, from ``start`` on."""

    prompt: float
    generated: float

    def counts(self, elapsed: float) -> tuple[float, float]:
        return float(math.floor(self.prompt * elapsed)), float(math.floor(self.generated * elapsed))


@dataclass
class FakeEngine:
    """One engine pod: its kind, its pod, its models and their token rates."""

    kind: str                                  # vllm, sglang, tgi, triton-trtllm, nim
    namespace: str
    pod: str
    models: dict[str, Tokens]
    kv_cache: float = 0.3
    preemptions_per_second: float = 0.0
    pod_model_label: str = ""                  # the pod's l9gpu.io/model label (TGI: no model label)
    start: float = field(default_factory=time.time)
    clock: Callable[[], float] = time.time

    @property
    def path(self) -> str:
        return f"/{self.kind}/v1/metrics" if self.kind == "nim" else f"/{self.kind}/metrics"

    def elapsed(self) -> float:
        return max(0.0, self.clock() - self.start)

    def text(self) -> bytes:
        if self.kind in ("tgi", "triton-trtllm"):
            return (self._tgi() if self.kind == "tgi" else self._triton()).encode()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(list(self._families())))
        return generate_latest(registry)

    # -- prometheus_client engines (Python): vLLM, SGLang, NIM -----------------------------
    def _families(self) -> Iterable[object]:
        t = self.elapsed()
        created = self.start
        if self.kind == "vllm":
            labels = ["model_name", "engine"]
            running = GaugeMetricFamily("vllm:num_requests_running", "Number of requests in model execution batches.",
                                        labels=labels)
            waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                                        labels=labels)
            old_kv = GaugeMetricFamily("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage."
                                       "DEPRECATED: Use vllm:kv_cache_usage_perc instead.", labels=labels)
            kv = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                                   labels=labels)
            preempt = CounterMetricFamily("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                                          labels=labels)
            prompt = CounterMetricFamily("vllm:prompt_tokens", "Number of prefill tokens processed.", labels=labels)
            gen = CounterMetricFamily("vllm:generation_tokens", "Number of generation tokens processed.",
                                      labels=labels)
            for model, tokens in self.models.items():
                values = [model, "0"]
                p, g = tokens.counts(t)
                running.add_metric(values, 8.0)
                waiting.add_metric(values, 0.0)
                old_kv.add_metric(values, self.kv_cache)
                kv.add_metric(values, self.kv_cache)
                preempt.add_metric(values, float(math.floor(self.preemptions_per_second * t)), created=created)
                prompt.add_metric(values, p, created=created)
                gen.add_metric(values, g, created=created)
            return running, waiting, old_kv, kv, preempt, prompt, gen
        if self.kind == "sglang":
            scheduler = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
            running = GaugeMetricFamily("sglang:num_running_reqs", "The number of running requests.",
                                        labels=scheduler)
            queued = GaugeMetricFamily("sglang:num_queue_reqs", "The number of requests in the waiting queue.",
                                       labels=scheduler)
            usage = GaugeMetricFamily("sglang:token_usage", "The token usage.", labels=scheduler)
            retracted = CounterMetricFamily("sglang:num_retracted_requests", "Total number of retracted requests.",
                                            labels=scheduler)
            prompt = CounterMetricFamily("sglang:prompt_tokens", "Number of prefill tokens processed.",
                                         labels=["model_name"])
            gen = CounterMetricFamily("sglang:generation_tokens", "Number of generation tokens processed.",
                                      labels=["model_name"])
            for model, tokens in self.models.items():
                p, g = tokens.counts(t)
                ranks = [model, "unified", "0", "0", "0"]
                running.add_metric(ranks, 4.0)
                queued.add_metric(ranks, 0.0)
                usage.add_metric(ranks, self.kv_cache)
                retracted.add_metric(ranks, float(math.floor(self.preemptions_per_second * t)), created=created)
                prompt.add_metric([model], p, created=created)
                gen.add_metric([model], g, created=created)
            return running, queued, usage, retracted, prompt, gen
        if self.kind == "nim":
            running = GaugeMetricFamily("num_requests_running", "Number of requests currently running on GPU.",
                                        labels=["model_name"])
            waiting = GaugeMetricFamily("num_requests_waiting", "Number of requests waiting to be processed.",
                                        labels=["model_name"])
            kv = GaugeMetricFamily("gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.",
                                   labels=["model_name"])
            prompt = CounterMetricFamily("prompt_tokens", "Number of prefill tokens processed.", labels=["model_name"])
            gen = CounterMetricFamily("generation_tokens", "Number of generation tokens processed.",
                                      labels=["model_name"])
            for model, tokens in self.models.items():
                p, g = tokens.counts(t)
                running.add_metric([model], 2.0)
                waiting.add_metric([model], 0.0)
                kv.add_metric([model], self.kv_cache)
                prompt.add_metric([model], p)
                gen.add_metric([model], g)
            return running, waiting, kv, prompt, gen
        raise ValueError(self.kind)

    # -- TGI (Rust: metrics-exporter-prometheus) --------------------------------------------
    def _tgi(self) -> str:
        (tokens,) = self.models.values()
        p, g = tokens.counts(self.elapsed())
        requests = math.floor(p / 500)  # 500-token prompts, 125 tokens generated each
        lines = ["# TYPE tgi_batch_current_size gauge", f"tgi_batch_current_size {2 if p else 0}",
                 "# TYPE tgi_queue_size gauge", "tgi_queue_size 0",
                 "# TYPE tgi_request_count counter", f"tgi_request_count {requests}"]
        for name, total, size in (("tgi_request_input_length", p, 500), ("tgi_request_generated_tokens", g, 125)):
            lines.append(f"# TYPE {name} histogram")
            for le in (10.0, 100.0, 1000.0, 10000.0):
                lines.append(f'{name}_bucket{{le="{le:g}"}} {requests if size <= le else 0}')
            lines += [f'{name}_bucket{{le="+Inf"}} {requests}', f"{name}_sum {total:g}", f"{name}_count {requests}"]
        return "\n".join(lines) + "\n"

    # -- Triton with the TensorRT-LLM backend (C++: prometheus-cpp) ---------------------------
    def _triton(self) -> str:
        t = self.elapsed()
        out = ["# HELP nv_inference_request_success Number of successful inference requests, all batch sizes",
               "# TYPE nv_inference_request_success counter"]
        counts = {model: tokens.counts(t) for model, tokens in self.models.items()}
        for model, (p, _) in counts.items():
            out.append(f'nv_inference_request_success{{model="{model}",version="1"}} {math.floor(p / 400)}')
        out += ["# HELP nv_trt_llm_request_metrics TRT LLM request metrics", "# TYPE nv_trt_llm_request_metrics gauge"]
        for model in counts:
            for kind, value in (("context", 1), ("scheduled", 3), ("max", 64), ("active", 3), ("waiting", 0)):
                out.append(f'nv_trt_llm_request_metrics{{model="{model}",request_type="{kind}",version="1"}} {value}')
        out += ["# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics",
                "# TYPE nv_trt_llm_kv_cache_block_metrics gauge"]
        for model in counts:
            used = round(6240 * self.kv_cache)
            for kind, value in (("tokens_per", 64), ("used", used), ("free", 6240 - used), ("max", 6240),
                                ("reused", 0), ("fraction", used / 6240)):
                out.append(f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="{kind}",model="{model}",'
                           f'version="1"}} {value:g}')
        for family, kind, index in (("nv_llm_output_token_len", "total_output_tokens", 1),
                                    ("nv_llm_input_token_len", "total_input_tokens", 0)):
            out += [f"# HELP {family} TRT LLM response metrics", f"# TYPE {family} histogram"]
            for model, values in counts.items():
                total = values[index]
                requests = math.floor(counts[model][0] / 400)
                labels = f'model="{model}",response_metric_type="{kind}",version="1"'
                out.append(f"{family}_count{{{labels}}} {requests}")
                out.append(f"{family}_sum{{{labels}}} {total:g}")
                for le in (10, 50, 100, 500, 1000):
                    out.append(f'{family}_bucket{{{labels},le="{le}"}} {requests if le >= 500 else 0}')
                out.append(f'{family}_bucket{{{labels},le="+Inf"}} {requests}')
        return "\n".join(out) + "\n"


class _Families:
    """A prometheus_client collector yielding fixed families (fresh every scrape)."""

    def __init__(self, families: list[object]):
        self.families = families

    def collect(self) -> Iterable[object]:
        return iter(self.families)


def app(engines: list[FakeEngine]) -> web.Application:
    """Every engine's /metrics under its path, in Prometheus text format 0.0.4."""
    application = web.Application()
    for engine in engines:
        async def handler(request: web.Request, engine: FakeEngine = engine) -> web.Response:
            return web.Response(body=engine.text(), headers={"Content-Type": "text/plain; version=0.0.4; "
                                                                             "charset=utf-8"})
        application.router.add_get(engine.path, handler)
    return application


# The relabelling docs/INFERENCE.md gives for engine pods found by Kubernetes pod discovery;
# here the discovery's labels come from static_configs.
RELABEL = [
    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    {"source_labels": ["__meta_kubernetes_pod_label_l9gpu_io_model"], "regex": "(.+)", "target_label": "model_name"},
]


def scrape_jobs(engines: list[FakeEngine], base: str) -> list[dict[str, object]]:
    """Scrape configs for Prometheus (tests/promserver.py ``jobs``): one per engine pod."""
    host = base.removeprefix("http://")
    jobs = []
    for engine in engines:
        labels = {"__meta_kubernetes_namespace": engine.namespace, "__meta_kubernetes_pod_name": engine.pod}
        if engine.pod_model_label:
            labels["__meta_kubernetes_pod_label_l9gpu_io_model"] = engine.pod_model_label
        jobs.append({"job_name": f"engine-{engine.kind}", "scrape_interval": "1s", "metrics_path": engine.path,
                     "honor_labels": True, "static_configs": [{"targets": [host], "labels": labels}],
                     "relabel_configs": RELABEL})
    return jobs


# The demo node's pods (exporter/devices/simulated/scenarios/default.yaml) as engines.
SHARED_GPU6 = (1 - 1.5 / 78.5) / 5   # each pod's share of GPU 6 (1 of 5 replicas, after the Slurm job's memory)


def demo_engines(start: float | None = None) -> list[FakeEngine]:
    """vLLM on the vLLM pod (GPUs 0-1), SGLang and Triton on two pods of the time-shared
    GPU 6, an idle TGI on a third, and NIM on the pod that was allocated GPU 7."""
    start = time.time() if start is None else start
    return [
        FakeEngine("vllm", "ml-production", "vllm-llama3-70b-6d8b94df7-q5z82",
                   {"meta-llama/Llama-3.1-70B-Instruct": Tokens(2400, 600)}, kv_cache=0.62, start=start),
        FakeEngine("sglang", "search", "embedder-7c9f5-abcde", {"Qwen/Qwen2.5-7B-Instruct": Tokens(150, 50)},
                   kv_cache=0.35, start=start),
        FakeEngine("triton-trtllm", "docs", "ocr-worker-66f7d-klmno",
                   {"llama-3.1-8b": Tokens(90, 30), "mistral-7b": Tokens(20, 20)}, kv_cache=0.2, start=start),
        FakeEngine("tgi", "search", "reranker-5b8d4-fghij", {"": Tokens(0, 0)}, kv_cache=0.0,
                   pod_model_label="bge-reranker-v2", start=start),
        FakeEngine("nim", "ml-research", "idle-reservation-0", {"meta/llama-3.1-8b-instruct": Tokens(100, 50)},
                   kv_cache=0.1, start=start),
    ]
