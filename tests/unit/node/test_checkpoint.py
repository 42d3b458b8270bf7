"""node.learn.checkpoint: atomic writes, keep-N, damaged checkpoints ignored, exact resume, SIGKILL mid-write."""

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from node.config import LearnerConfig
from node.learn.checkpoint import load_latest, restore, save_checkpoint
from node.learn.learner import Learner, TrainSample

ROOT = Path(__file__).resolve().parents[3]


def tiny_model(seed: int = 0, tie: bool = True) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
    )
    return Qwen2ForCausalLM(cfg)


def make_learner(seed: int = 0, tie: bool = True) -> Learner:
    return Learner(tiny_model(seed, tie), LearnerConfig(lr=1e-2), device="cpu", pad_token_id=0, max_tokens=8)


def batch(step: int) -> list[TrainSample]:
    g = torch.Generator().manual_seed(100 + step)
    return [
        TrainSample(
            torch.randint(2, 100, (3,), generator=g).tolist(),
            torch.randint(2, 100, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist(),
            float(torch.randn(1, generator=g)),
        )
        for _ in range(4)
    ]


def params(learner: Learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.model.state_dict().items()}


def test_save_and_load_roundtrip_with_tied_weights(tmp_path):
    lrn = make_learner()
    assert lrn.model.lm_head.weight.data_ptr() == lrn.model.model.embed_tokens.weight.data_ptr()
    lrn.step(batch(0))
    path = save_checkpoint(tmp_path, lrn, step=1, extra={"rollouts": 7})
    assert path.name == "step-00000001"
    assert (tmp_path / "latest").read_text() == "step-00000001"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    ckpt = load_latest(tmp_path)
    assert ckpt is not None and ckpt.step == 1 and ckpt.policy_version == 1 and ckpt.extra == {"rollouts": 7}
    other = make_learner(seed=5)
    restore(other, ckpt)
    assert other.policy_version == 1
    for k, v in params(lrn).items():
        assert torch.equal(v, other.model.state_dict()[k]), k
    assert other.model.lm_head.weight.data_ptr() == other.model.model.embed_tokens.weight.data_ptr()


def test_keep_n_and_latest_pointer(tmp_path):
    lrn = make_learner(tie=False)
    for step in range(1, 6):
        save_checkpoint(tmp_path, lrn, step=step, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000004", "step-00000005"]
    assert load_latest(tmp_path).step == 5
    assert load_latest(tmp_path / "missing") is None
    assert load_latest(tmp_path.parent / "empty-nothing") is None


def test_incomplete_and_corrupt_checkpoints_are_ignored(tmp_path):
    lrn = make_learner()
    save_checkpoint(tmp_path, lrn, step=1, keep=5)
    save_checkpoint(tmp_path, lrn, step=2, keep=5)
    save_checkpoint(tmp_path, lrn, step=3, keep=5)
    # Newest: a byte flipped in the weights. Next: manifest missing (as if written by something else).
    weights = tmp_path / "step-00000003" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    (tmp_path / "step-00000002" / "manifest.json").unlink()
    # A temporary directory a crash left behind, with a bigger step number.
    (tmp_path / ".tmp-step-00000009-deadbeef").mkdir()
    (tmp_path / ".tmp-step-00000009-deadbeef" / "model.safetensors").write_bytes(b"partial")
    ckpt = load_latest(tmp_path)
    assert ckpt is not None and ckpt.step == 1
    restore(make_learner(seed=3), ckpt)
    # A dangling pointer is not trusted either.
    (tmp_path / "latest").write_text("step-00000042")
    assert load_latest(tmp_path).step == 1
    # The next save clears the leftovers.
    save_checkpoint(tmp_path, lrn, step=4, keep=5)
    assert not (tmp_path / ".tmp-step-00000009-deadbeef").exists()


def test_resume_continues_exactly(tmp_path):
    k, m = 3, 3
    a = make_learner()
    for s in range(k):
        a.step(batch(s))
    random.seed(11)
    np.random.seed(11)
    torch.manual_seed(11)
    save_checkpoint(tmp_path, a, step=k, extra={"k": k})
    after_save = (random.random(), float(np.random.rand()), torch.rand(3))
    for s in range(k, k + m):
        a.step(batch(s))
    expected = params(a)

    b = make_learner(seed=42)  # different initial weights: everything must come from the checkpoint
    random.seed(0)
    torch.manual_seed(0)
    restore(b, load_latest(tmp_path))
    resumed = (random.random(), float(np.random.rand()), torch.rand(3))
    assert resumed[0] == after_save[0] and resumed[1] == after_save[1] and torch.equal(resumed[2], after_save[2])
    assert b.policy_version == k
    for s in range(k, k + m):
        b.step(batch(s))
    assert b.policy_version == k + m
    for key, value in expected.items():
        assert torch.equal(value, b.model.state_dict()[key]), key


WRITER = textwrap.dedent(
    """
    import sys, torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from node.learn.checkpoint import save_checkpoint
    from node.config import LearnerConfig
    from node.learn.learner import Learner, TrainSample

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=4000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    lrn = Learner(Qwen2ForCausalLM(cfg), LearnerConfig(), device="cpu", pad_token_id=0, max_tokens=4)
    lrn.step([TrainSample([5, 6], [7, 8], 1.0), TrainSample([5, 6], [9], -1.0)])
    step = 0
    while True:
        step += 1
        lrn.policy_version = step
        save_checkpoint(sys.argv[1], lrn, step=step, extra={"step": step}, keep=2)
        print(step, flush=True)
    """
)


def test_sigkill_mid_write_leaves_a_loadable_checkpoint(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    rng = random.Random(0)
    for attempt in range(3):
        run_dir = tmp_path / f"ckpts{attempt}"
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen([sys.executable, str(script), str(run_dir)], stdout=subprocess.PIPE, env=env, text=True)
        try:
            last = 0
            while last < 2:  # wait until it is writing in a loop
                line = proc.stdout.readline()
                assert line, "writer exited early"
                last = int(line)
            time.sleep(rng.uniform(0.0, 0.3))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        rest = proc.stdout.read()
        proc.stdout.close()
        printed = [last] + [int(x) for x in rest.split()]
        ckpt = load_latest(run_dir)
        assert ckpt is not None
        assert ckpt.step >= max(printed)  # every save it reported as done survives
        assert ckpt.extra == {"step": ckpt.step} and ckpt.policy_version == ckpt.step
        cfg = json.loads((ckpt.path / "manifest.json").read_text())
        assert set(cfg["files"]) >= {"model.safetensors", "optimizer.safetensors"}
        torch.manual_seed(1)
        big = Qwen2Config(
            vocab_size=4000,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
        )
        fresh = Learner(Qwen2ForCausalLM(big), LearnerConfig(), device="cpu", pad_token_id=0, max_tokens=4)
        fresh.step([TrainSample([5, 6], [7, 8], 1.0)])  # creates optimizer state to be overwritten
        restore(fresh, ckpt)
        assert fresh.policy_version == ckpt.step


def test_the_trace_optimizer_is_saved_restored_and_optional(tmp_path, caplog):
    def trace_learner(seed: int = 0) -> Learner:
        cfg = LearnerConfig(lr=1e-2, trace_lr=1e-2)
        return Learner(tiny_model(seed), cfg, device="cpu", pad_token_id=0, max_tokens=8)

    rows = [TrainSample(s.prompt_ids, s.completion_ids, 1.0, external=True, trace=True) for s in batch(9)]
    a = trace_learner()
    a.step(batch(0) + rows)
    save_checkpoint(tmp_path / "t", a, step=1)
    assert (tmp_path / "t" / "step-00000001" / "trace_optimizer.safetensors").is_file()
    b = trace_learner(seed=4)
    restore(b, load_latest(tmp_path / "t"))
    sa, sb = a.trace_optimizer.state_dict()["state"], b.trace_optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]) for i in sa)
    a.step(batch(1) + rows)
    b.step(batch(1) + rows)
    for k, v in params(a).items():
        assert torch.equal(v, b.model.state_dict()[k]), k
    plain = make_learner()  # a checkpoint with the trace state loads into a learner without one, and back
    restore(plain, load_latest(tmp_path / "t"))
    plain.step(batch(2))
    save_checkpoint(tmp_path / "p", plain, step=2)
    c = trace_learner()
    with caplog.at_level("INFO", logger="node.learn.checkpoint"):
        restore(c, load_latest(tmp_path / "p"))
    assert "trace step starts fresh" in caplog.text and not c.trace_optimizer.state_dict()["state"]


def test_the_trace_anchors_reservoir_is_saved_and_restored(tmp_path):
    def anchored(seed: int = 0) -> Learner:
        cfg = LearnerConfig(lr=1e-2, trace_lr=1e-2, trace_anchor=1.0, trace_anchor_rows=3)
        return Learner(tiny_model(seed), cfg, device="cpu", pad_token_id=0, max_tokens=8)

    own = [dataclasses.replace(s, right=True) for s in batch(0)]
    rows = [TrainSample(s.prompt_ids, s.completion_ids, 1.0, external=True, trace=True) for s in batch(9)]
    a = anchored()
    a.step(own + rows)
    assert len(a.anchor_pool) == 3 and a.anchor_seen == len(own)
    save_checkpoint(tmp_path / "t", a, step=1)
    b = anchored()  # a resumed node rebuilds its learner from the same initial model: the anchor's reference
    assert not b.anchor_pool
    restore(b, load_latest(tmp_path / "t"))
    assert b.anchor_seen == a.anchor_seen
    assert [(r.prompt_ids, r.completion_ids) for r in b.anchor_pool] == [
        (r.prompt_ids, r.completion_ids) for r in a.anchor_pool
    ]
    more = [dataclasses.replace(s, right=True) for s in batch(1)]
    a.step(more + rows)
    b.step(more + rows)
    assert [r.completion_ids for r in b.anchor_pool] == [r.completion_ids for r in a.anchor_pool]
    for k, v in params(a).items():
        assert torch.equal(v, b.model.state_dict()[k]), k


def test_the_trace_steps_replay_buffer_is_saved_and_restored(tmp_path):
    def replaying() -> Learner:
        cfg = LearnerConfig(lr=1e-2, trace_lr=1e-2, trace_batch=3)
        return Learner(tiny_model(0), cfg, device="cpu", pad_token_id=0, max_tokens=8)

    rows = [  # two peers: the buffer shares by (source, prompt) groups, so the source must come back too
        TrainSample(s.prompt_ids, s.completion_ids, 1.0, external=True, trace=True, family="f", source=f"peer{i % 2}")
        for i, s in enumerate(batch(9))
    ]
    a = replaying()
    a.step(batch(0) + rows + rows)
    assert len(a.trace_buffer) == len({(tuple(r.prompt_ids), tuple(r.completion_ids)) for r in rows})
    save_checkpoint(tmp_path / "t", a, step=1)
    b = replaying()
    restore(b, load_latest(tmp_path / "t"))
    assert [(r.prompt_ids, r.completion_ids, r.family, r.source) for r in b.trace_buffer] == [
        (r.prompt_ids, r.completion_ids, r.family, r.source) for r in a.trace_buffer
    ]
    assert {r.source for r in b.trace_buffer} == {"peer0", "peer1"}
    assert b.trace_keys == a.trace_keys
    more = [TrainSample(s.prompt_ids, s.completion_ids, 1.0, external=True, trace=True) for s in batch(5)][:1]
    # one new trace: the step's other two come from the restored buffer, by the resumed run's draw
    ma, mb = a.step(batch(1) + more), b.step(batch(1) + more)
    assert ma["trace_rows"] == mb["trace_rows"] == 3 and ma["trace_new"] == 1
    assert ma["trace_new"] == mb["trace_new"] and ma["trace_buffer"] == mb["trace_buffer"]
    for k, v in params(a).items():
        assert torch.equal(v, b.model.state_dict()[k]), k
