"""Every experiment YAML in configs/sim/ validates (plain and --quick); broken ones give one clear line."""

from pathlib import Path

import pytest

from protocol.errors import ConfigError
from sim.config import SimConfig, load_sim_config, node_seed

ROOT = Path(__file__).resolve().parents[3]
SIM_CONFIGS = sorted((ROOT / "configs" / "sim").glob("*.yaml"))


def test_there_are_sim_configs():
    names = {p.name for p in SIM_CONFIGS}
    assert {"sapo.yaml", "sapo-quick.yaml", "scale.yaml"} <= names


@pytest.mark.parametrize("quick", [False, True])
@pytest.mark.parametrize("path", SIM_CONFIGS, ids=lambda p: p.name)
def test_sim_configs_validate(path, quick):
    cfg = load_sim_config(str(path), quick=quick)
    for v in cfg.configurations:
        for i in range(min(cfg.nodes, 3)):
            cfg.node_config(v.name, i, cfg.seeds[0])


def test_sapo_config_rows_say_what_they_are():
    # Row names encode population, budget and split (benchmarks/b4_sapo.py compares each with its 8-0).
    cfg = load_sim_config(str(ROOT / "configs" / "sim" / "sapo.yaml"))
    assert cfg.nodes == 8 and len(cfg.seeds) == 3 and cfg.steps >= 300
    for v in cfg.configurations:
        pop, budget, i, j = v.name.split("-")[:4]
        n = cfg.node_config(v.name, 0, 0)
        assert (n.sapo.local_groups, n.sapo.external_groups) == (int(i), int(j))
        assert n.rollout.prompts_per_step == (16 if v.name.endswith("gen16") else 8 if budget == "same" else int(i))
        families = {
            tuple(f["name"] for f in cfg.node_config(v.name, k, 0).model.builtin["sft_families"]) for k in range(8)
        }
        assert len(families) == (3 if pop == "het" else 1), v.name  # het: three warm-start subsets
        assert len({f.name for f in n.tasks.families}) == 9


def _write(tmp_path, text):
    p = tmp_path / "exp.yaml"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("nodes: 2\nchurn: [{node: 5, leave: 1}]\n", "churn names node 5"),
        ("nodes: 2\nchurn: [{node: 0, leave: 3, rejoin: 2}]\n", "rejoin (2) must be after leave (3)"),
        ("nodes: 2\nheterogeneity: {speed: {0: 0}}\n", "speed factors"),
        ("configurations: [{name: a}, {name: a}]\n", "rename"),
        ("node: {rollout: {group_size: 1}}\n", "rollout.group_size"),
        ("configurations: [{name: a, node: {sapo: {lokal_groups: 1}}}]\n", "unknown field"),
        ("mode: multiprocess\npolicy: scripted\n", "does not support policy: scripted"),
        ("network: {loss: 1.5}\n", "network.loss"),
        ("stepz: 3\n", "stepz"),
        ("policy: scripted\nnode: {rollout: {max_new_tokens: 8}}\n", "max_new_tokens"),
    ],
)
def test_broken_configs_are_one_line(tmp_path, text, needle):
    with pytest.raises(ConfigError) as e:
        load_sim_config(_write(tmp_path, text))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_overrides_and_merge_order(tmp_path):
    path = _write(
        tmp_path,
        "nodes: 3\nnode: {learner: {lr: 0.1}}\n"
        "configurations: [{name: v, node: {learner: {lr: 0.2}, sapo: {local_groups: 4, external_groups: 4}}}]\n"
        "heterogeneity: {node_overrides: {2: {learner: {lr: 0.3}}}}\n",
    )
    cfg = load_sim_config(path, ["seeds=[4, 5]"])
    assert cfg.seeds == [4, 5]
    assert cfg.node_config("v", 0, 4).learner.lr == 0.2
    assert cfg.node_config("v", 2, 4).learner.lr == 0.3
    assert cfg.node_config("v", 0, 4).sapo.external_groups == 4
    assert cfg.node_config("v", 0, 4).seed == node_seed(4, 0) != node_seed(4, 1)


def test_a_configurations_node_overrides_merge_last(tmp_path):
    path = _write(
        tmp_path,
        "nodes: 3\nnode: {learner: {lr: 0.1}}\n"
        "heterogeneity: {node_overrides: {1: {learner: {lr: 0.3, beta: 0.5}}}}\n"
        "configurations: [{name: a, node_overrides: {1: {learner: {lr: 0.4}}}}, {name: b}]\n",
    )
    cfg = load_sim_config(path)
    assert cfg.node_config("a", 1, 0).learner.lr == 0.4 and cfg.node_config("a", 1, 0).learner.beta == 0.5
    assert cfg.node_config("b", 1, 0).learner.lr == 0.3 and cfg.node_config("a", 0, 0).learner.lr == 0.1
    with pytest.raises(ConfigError, match="node_overrides names node 7"):
        load_sim_config(_write(tmp_path, "nodes: 2\nconfigurations: [{name: a, node_overrides: {7: {}}}]\n"))


def test_quick_overrides(tmp_path):
    path = _write(tmp_path, "steps: 50\nquick: {steps: 2, network.latency_steps: 1}\n")
    assert load_sim_config(path).steps == 50
    quick = load_sim_config(path, quick=True)
    assert quick.steps == 2 and quick.network.latency_steps == 1


def test_defaults_validate():
    assert SimConfig().nodes >= 1


def test_cli_broken_config_exits_1_with_one_line(tmp_path):
    from typer.testing import CliRunner

    from sim.cli import app

    res = CliRunner().invoke(app, ["run", _write(tmp_path, "nodes: 0\n"), "--out", str(tmp_path / "out")])
    assert res.exit_code == 1
    assert "nodes" in res.output and "Traceback" not in res.output
