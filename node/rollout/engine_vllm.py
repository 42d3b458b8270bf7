"""The vLLM rollout engine (GPU): the :class:`~node.rollout.engine.RolloutEngine` interface over vLLM, weights synced
from the learner after every update without a restart, per-token behaviour logprobs returned.

**Deployment.** vLLM pins its own torch (and an older transformers) and cannot share the node's environment on
CPU machines (FACTS.md), so there are two modes (``vllm.mode``):

* ``server`` (default): a rollout server in its own venv on the same machine, ``python -m node.rollout.engine_vllm serve
  --model PATH --port 8765`` (that venv: ``pip install vllm`` then ``pip install --no-deps -e .`` and ``pydantic``).
  The node talks JSON over HTTP on localhost (:class:`VllmServerEngine`); weight sync = the node writes the
  learner's weights to ``vllm.sync_dir`` as safetensors (atomic rename) and the server loads them into the running
  model (``model.load_weights``), so no restart and no pickle.
* ``in_process``: vLLM imported into the node (:class:`VllmEngine`), for GPU machines whose environment is vLLM's
  torch; weight sync goes through the same safetensors file and ``collective_rpc``.

Behaviour logprobs are vLLM's ``processed_logprobs`` (after temperature and top-p), the same convention as
``TransformersEngine``. APRIL on vLLM generates in chunks of ``vllm.chunk_tokens`` and asks ``should_stop``
between chunks (prefix caching makes the continuation's prefill cheap).

This is the only module that imports vllm, and only inside functions: importing it costs nothing and the default
path never touches it. Tests are marked ``gpu``. Knows nothing about tasks, rewards or the swarm.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import urllib.request
from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.rollout.engine import FinishReason, GeneratedCompletion, RolloutEngine, RolloutRequest, StopFn
from node.seams import GenerationSettings

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "weights.safetensors"


def write_weights(model: Any, sync_dir: Path) -> Path:
    """Write ``model``'s state dict to ``sync_dir/weights.safetensors`` atomically (tmp file + ``os.replace``)."""
    from safetensors.torch import save_file

    sync_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    seen: dict[int, str] = {}
    for k in list(state):  # tied weights are stored once (safetensors refuses shared storage)
        ptr = state[k].data_ptr()
        if ptr in seen:
            del state[k]
        else:
            seen[ptr] = k
    tmp = sync_dir / f".{WEIGHTS_FILE}.tmp"
    save_file(state, str(tmp))
    final = sync_dir / WEIGHTS_FILE
    os.replace(tmp, final)
    return final


def _load_weights_into_worker(worker: Any, path: str) -> None:
    """Run inside a vLLM worker (``collective_rpc``): load a safetensors state dict into the live model."""
    from safetensors.torch import load_file

    worker.model_runner.model.load_weights(weights=list(load_file(path).items()))


class VllmBackend:
    """The vLLM side: an ``LLM`` with processed logprobs and prefix caching; generate token ids, load weights."""

    def __init__(self, model: str, *, gpu_memory_utilization: float = 0.4, dtype: str = "auto", seed: int = 0):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the model lives in this process
        from vllm import LLM

        self.llm = LLM(
            model=model,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
            seed=seed,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
        )
        self.eos = set(self.llm.get_tokenizer().all_special_ids)

    def complete(
        self, prompts: list[list[int]], max_tokens: list[int], temperature: float, top_p: float, seed: int | None
    ) -> list[dict[str, Any]]:
        """One sample per token prompt: ``{"token_ids", "logprobs", "finish_reason"}`` (reason stop/length)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [
            SamplingParams(
                temperature=temperature,
                top_p=top_p,
                max_tokens=m,
                logprobs=0,  # the sampled token's logprob only
                seed=None if seed is None else seed + i,
                skip_special_tokens=True,
            )
            for i, m in enumerate(max_tokens)
        ]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        result = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(step[t].logprob) for step, t in zip(c.logprobs or [], ids, strict=True)]
            result.append(
                {"token_ids": ids, "logprobs": lps, "finish_reason": "stop" if c.finish_reason == "stop" else "length"}
            )
        return result

    def load_weights(self, path: str) -> None:
        self.llm.collective_rpc(_load_weights_into_worker, args=(path,))
        self.llm.reset_prefix_cache()  # cached KV was computed by the old weights


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
        self, policy: Any, *, sync_dir: Path, chunk_tokens: int = 64, settings: GenerationSettings | None = None
    ) -> None:
        self.policy = policy
        self.settings = settings or GenerationSettings()
        self.sync_dir = Path(sync_dir)
        self.chunk_tokens = chunk_tokens
        self.policy_version = 0

    @abstractmethod
    def _complete(
        self, prompts: list[list[int]], max_tokens: list[int], temperature: float, top_p: float, seed: int | None
    ) -> list[dict[str, Any]]: ...

    @abstractmethod
    def _load(self, path: Path) -> None: ...

    def generate_requests(
        self,
        requests: list[RolloutRequest],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        should_stop: StopFn | None = None,
    ) -> list[GeneratedCompletion]:
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
        out = []
        for r, s in zip(requests, state, strict=True):
            mixed = any(v != self.policy_version for v in s.ver)
            out.append(
                GeneratedCompletion(
                    text=self.policy.tokenizer.decode(s.ids, skip_special_tokens=True),
                    prompt_ids=list(r.prompt_ids),
                    token_ids=s.ids,
                    logprobs=s.lps,
                    finish_reason=s.reason or "abort",
                    policy_version=min(s.ver) if s.ver else self.policy_version,
                    token_versions=s.ver if mixed else None,
                )
            )
        return out

    def sync_weights(self, version: int) -> None:
        """Copy the learner's weights (the policy's model) into vLLM and tag later tokens with ``version``."""
        self._load(write_weights(self.policy.model, self.sync_dir))
        self.set_policy_version(version)

    def set_policy_version(self, version: int) -> None:
        # The runtime calls this after every learner update: a new version means new weights to copy.
        if int(version) != self.policy_version and getattr(self, "_synced_version", None) != int(version):
            self._synced_version = int(version)
            self._load(write_weights(self.policy.model, self.sync_dir))
        self.policy_version = int(version)


class VllmEngine(_ChunkedEngine):
    """vLLM in the node's own process (GPU machines whose torch is vLLM's)."""

    def __init__(
        self,
        policy: Any,
        model_path: str,
        *,
        sync_dir: Path,
        gpu_memory_utilization: float,
        chunk_tokens: int = 64,
        settings: GenerationSettings | None = None,
    ):
        super().__init__(policy, sync_dir=sync_dir, chunk_tokens=chunk_tokens, settings=settings)
        self.backend = VllmBackend(model_path, gpu_memory_utilization=gpu_memory_utilization)

    def _complete(self, prompts, max_tokens, temperature, top_p, seed):
        return self.backend.complete(prompts, max_tokens, temperature, top_p, seed)

    def _load(self, path: Path) -> None:
        self.backend.load_weights(str(path))


class VllmServerEngine(_ChunkedEngine):
    """A client of the rollout server (``python -m node.rollout.engine_vllm serve``) on localhost."""

    def __init__(
        self,
        policy: Any,
        url: str,
        *,
        sync_dir: Path,
        timeout_s: float = 600.0,
        chunk_tokens: int = 64,
        settings: GenerationSettings | None = None,
    ):
        super().__init__(policy, sync_dir=sync_dir, chunk_tokens=chunk_tokens, settings=settings)
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        req = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            return json.loads(resp.read())

    def _complete(self, prompts, max_tokens, temperature, top_p, seed):
        body = {"prompts": prompts, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "seed": seed}
        return self._post("/generate", body)["outputs"]

    def _load(self, path: Path) -> None:
        self._post("/load_weights", {"path": str(Path(path).resolve())})


def build_vllm_engine(cfg: Any, policy: Any) -> RolloutEngine:
    """The engine ``cfg.vllm`` describes; the policy stays the learner's (tokenizer, weights to sync)."""
    v = cfg.vllm
    settings = GenerationSettings.of(cfg.rollout)
    sync_dir = v.sync_dir or Path(os.environ.get("RL_SWARM_RUN_DIR", ".")) / "vllm-weights"
    if v.mode == "server":
        engine: _ChunkedEngine = VllmServerEngine(
            policy, v.url, sync_dir=sync_dir, timeout_s=v.timeout_s, chunk_tokens=v.chunk_tokens, settings=settings
        )
    else:
        engine = VllmEngine(
            policy,
            cfg.model.name,
            sync_dir=sync_dir,
            gpu_memory_utilization=v.gpu_memory_utilization,
            chunk_tokens=v.chunk_tokens,
            settings=settings,
        )
    engine.sync_weights(0)  # the learner's weights, whatever the server loaded from disk
    return engine


def serve(model: str, host: str, port: int, gpu_memory_utilization: float) -> None:
    """The rollout server: ``POST /generate`` and ``POST /load_weights`` (JSON), one request at a time."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Lock

    backend = VllmBackend(model, gpu_memory_utilization=gpu_memory_utilization)
    lock = Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            with lock:
                if self.path == "/generate":
                    args = [body[k] for k in ("prompts", "max_tokens", "temperature", "top_p", "seed")]
                    reply: Any = {"outputs": backend.complete(*args)}
                elif self.path == "/load_weights":
                    backend.load_weights(body["path"])
                    reply = {"ok": True}
                else:
                    self.send_error(404)
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
    server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="vLLM rollout server for a swarm node (run it in the vLLM venv)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--model", required=True, help="hub name or local directory (the node's model)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8765)
    s.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    serve(args.model, args.host, args.port, args.gpu_memory_utilization)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
