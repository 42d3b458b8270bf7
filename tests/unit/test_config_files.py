"""Every YAML file in configs/ validates against its model; broken configs give one clear line."""

from pathlib import Path

import pytest
from pydantic import ValidationError

from node.config import NodeConfig
from protocol.config import load_config, read_yaml, validate_config, write_resolved
from protocol.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
NODE_CONFIGS = sorted((ROOT / "configs" / "node").glob("*.yaml")) + sorted((ROOT / "node" / "profiles").glob("*.yaml"))


@pytest.mark.parametrize("path", NODE_CONFIGS, ids=lambda p: p.name)
def test_node_configs_validate(path):
    load_config(NodeConfig, path)


def test_there_are_node_configs():
    assert NODE_CONFIGS, "configs/node/ should hold at least the default node config"


def test_the_default_profile_is_the_laboratory_node_and_a_config_names_a_file_or_a_profile(tmp_path):
    from node.config import DEFAULT_PROFILE, config_file, profiles

    assert {"lab", "smollm2", "tiny"} <= set(profiles())
    smol = load_config(NodeConfig, config_file("smollm2"))  # the real-model profile: the lab node's swarm and families
    assert smol.model.name == "smollm2-135m" and smol.swarm_id == "rl-swarm-lab"
    assert smol.tasks.families == load_config(NodeConfig, config_file("lab")).tasks.families
    assert smol.eval.sized_for(smol.model.name).items_per_family == smol.eval.quick_items_per_family  # stays quick
    default = load_config(NodeConfig, config_file(None))
    assert DEFAULT_PROFILE == "lab" and default.model.name == "builtin:lab"
    assert [f.name for f in default.tasks.families] == ["lab_add", "lab_sub"]
    assert load_config(NodeConfig, config_file("tiny")).model.name == "builtin:tiny"
    own = tmp_path / "lab"  # an existing file wins over a profile's name
    own.write_text("swarm_id: mine\n")
    assert config_file(str(own)) == own and config_file("missing.yaml") == Path("missing.yaml")
    with pytest.raises(ConfigError, match="neither a config file nor a profile .profiles: lab, smollm2, tiny"):
        config_file("labb")


def test_unknown_field_names_the_field(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("learner:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError) as e:
        load_config(NodeConfig, p)
    msg = str(e.value)
    assert "learner.lrr" in msg and "unknown field" in msg and "\n" not in msg


def test_out_of_range_value_names_the_field(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("rollout:\n  group_size: 1\n")
    with pytest.raises(ConfigError, match=r"rollout\.group_size"):
        load_config(NodeConfig, p)


def test_broken_yaml_is_one_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("learner: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(NodeConfig, p)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(NodeConfig, tmp_path / "nope.yaml")


def test_overrides_are_typed_and_nested():
    cfg = load_config(NodeConfig, None, ["learner.lr=0.01", "sapo.external_groups=4", "model.device=cpu"])
    assert cfg.learner.lr == 0.01 and cfg.sapo.external_groups == 4 and cfg.model.device == "cpu"


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="section.field=value"):
        load_config(NodeConfig, None, ["learner.lr"])


def test_cross_field_check_says_what_to_change():
    with pytest.raises(ConfigError, match="raise prompts_per_step"):
        validate_config(NodeConfig, {"rollout": {"prompts_per_step": 2}, "sapo": {"local_groups": 4}})


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(NodeConfig, None, ["learner.lr=0.002"])
    path = write_resolved(cfg, tmp_path)
    again = validate_config(NodeConfig, read_yaml(path))
    assert again == cfg


def test_transport_section_without_type_means_hivemind():
    cfg = load_config(
        NodeConfig, None, ["transport.port=4321", 'transport.initial_peers=["/ip4/127.0.0.1/tcp/1/p2p/x"]']
    )
    assert cfg.transport.type == "hivemind" and cfg.transport.port == 4321
    assert load_config(NodeConfig, None, ["transport.type=memory"]).transport.type == "memory"


def test_publish_rate_must_fit_the_peer_quota():
    with pytest.raises(ConfigError, match=r"raise runtime.publish_interval_s to at least"):
        load_config(NodeConfig, None, ["runtime.publish_interval_s=0.1"])


@pytest.mark.timeout(900)  # a hang guard only: under load the writers take minutes, so each is waited on to its exit
def test_two_processes_can_write_the_resolved_config_into_one_run_dir(tmp_path):
    """Parallel benchmark runs share a run directory: neither may lose the other's temporary file."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from node.config import NodeConfig\n"
        "from protocol.config import load_config, write_resolved\n"
        "cfg = load_config(NodeConfig, None, [])\n"
        "for _ in range(300):\n"
        "    write_resolved(cfg, sys.argv[1])\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    errors = [p.communicate()[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert validate_config(NodeConfig, read_yaml(tmp_path / "config.yaml")) == load_config(NodeConfig, None, [])
    assert not list(tmp_path.glob("*.tmp")), "no temporary file is left behind"


def test_learning_rate_defaults_by_model_and_an_explicit_one_wins(tmp_path):
    from node.config import PRETRAINED_LR

    assert load_config(NodeConfig, None, []).learner.lr == 3e-4  # the built-in model
    smol = load_config(NodeConfig, None, ["model.name=smollm2-135m"])
    assert smol.learner.lr == PRETRAINED_LR == 1e-5 and smol.learner.micro_batch_size == 8
    assert smol.mnpo.micro_batch_size == 8 and load_config(NodeConfig, None, []).mnpo.micro_batch_size == 32
    assert (
        load_config(NodeConfig, None, ["model.name=smollm2-135m", "mnpo.micro_batch_size=16"]).mnpo.micro_batch_size
        == 16
    )
    assert load_config(NodeConfig, None, ["model.name=smollm2-135m", "learner.lr=3e-4"]).learner.lr == 3e-4
    # the resolved config a run writes keeps what the run used, explicitly
    path = write_resolved(smol, tmp_path)
    assert load_config(NodeConfig, path, ["model.name=builtin:tiny"]).learner.lr == 1e-5


def test_pretrained_learning_rate_does_not_touch_a_shared_learner_config():
    from node.config import LearnerConfig, ModelConfig

    shared = LearnerConfig()
    smol = NodeConfig(learner=shared, model=ModelConfig(name="smollm2-135m"))
    assert smol.learner.lr == 1e-5
    assert shared.lr == 3e-4 and NodeConfig(learner=shared).learner.lr == 3e-4


def test_a_warm_start_may_not_reach_into_the_dev_or_test_side():
    warm = "model.warm_start={families: [{name: chain_sum}], test_fraction: 0.1, dev_fraction: 0.1}"
    assert load_config(NodeConfig, None, [warm]).model.warm_start is not None
    wider = "model.warm_start={families: [{name: chain_sum}], test_fraction: 0.05, dev_fraction: 0.2}"
    assert load_config(NodeConfig, None, [wider, "model.name=x", "tasks.test_fraction=0.15"]).model.warm_start
    with pytest.raises(ConfigError, match="warm start would train on dev or test items"):
        load_config(NodeConfig, None, [warm, "model.name=x", "tasks.dev_fraction=0.2"])
    with pytest.raises(ConfigError, match="built-in model's warm start"):
        load_config(NodeConfig, None, ["tasks.test_fraction=0.2"])
    with pytest.raises(ConfigError, match="heldout_fraction was replaced by"):
        load_config(NodeConfig, None, ["tasks.heldout_fraction=0.1"])


def test_default_local_groups_follow_a_smaller_batch_but_a_set_one_is_checked():
    """The README's SmolLM2 line asks for 4 prompts a step and leaves sapo alone: it must start."""
    cfg = NodeConfig.model_validate({"rollout": {"prompts_per_step": 4}})
    assert cfg.sapo.local_groups == 4
    assert NodeConfig.model_validate(cfg.model_dump(mode="json")).sapo.local_groups == 4  # the resolved file
    assert NodeConfig.model_validate({}).sapo.local_groups == 16  # peer-trace: no RL slots for peers, every group
    assert NodeConfig.model_validate({"sapo": {"peer_advantage": "receiver"}}).sapo.local_groups == 8  # I/J 8/8
    with pytest.raises(ValidationError, match=r"sapo.local_groups \(8\) exceeds rollout.prompts_per_step \(4\)"):
        NodeConfig.model_validate({"rollout": {"prompts_per_step": 4}, "sapo": {"local_groups": 8}})


def test_sapo_benchmarks_pin_sapo_as_written_while_nodes_default_to_peer_trace():
    """The node default is peer-trace (the transfer comparison's rule), with all-right groups published; the
    experiments that measure SAPO as the paper writes it (B4's configs, the controls' (c) arm) pin group credit,
    so a change of the default cannot silently change what they measure."""
    from sim.config import load_sim_config

    default = NodeConfig().sapo
    assert (default.peer_advantage, default.publish_solved, default.trace_groups) == ("guided", True, 16)
    root = Path(__file__).resolve().parents[2] / "configs" / "sim"
    pinned = {
        "sapo.yaml": None,
        "sapo-quick.yaml": None,
        "sapo-lab.yaml": None,
        "controls-het.yaml": "share",
        "controls-homo.yaml": "share",
    }
    for name, only in pinned.items():
        sim = load_sim_config(str(root / name), [])
        variants = [v.name for v in sim.configurations if only in (None, v.name)]
        assert variants, name
        for variant in variants:
            for index in range(sim.nodes):
                sapo = sim.node_config(variant, index, 0).sapo
                assert (sapo.peer_advantage, sapo.publish_solved) == ("group", False), (name, variant, index)


def test_the_default_credit_is_peer_trace_and_a_config_naming_a_credit_or_a_split_keeps_its_meaning():
    """Left unset, a node takes peer-trace (``PEER_TRACE_DEFAULTS``): no RL slots for peers, 16 peers' groups a step
    to the trace step, modal text, the trace step at the node's RL rate (whatever sets it) on 32 traces a step. A
    config that names the credit or SAPO's split gets what it got before: ``external_groups: 0`` is a node alone."""
    from node.config import PEER_TRACE_DEFAULTS, LearnerConfig, ModelConfig

    cfg = NodeConfig.model_validate({})
    s, lrn = cfg.sapo, cfg.learner
    assert {k: getattr(s, k) for k in PEER_TRACE_DEFAULTS} == PEER_TRACE_DEFAULTS
    assert (lrn.lr, lrn.trace_lr, lrn.trace_batch) == (3e-4, 3e-4, 32)
    assert NodeConfig.model_validate(cfg.model_dump(mode="json")) == cfg  # the resolved file means the same
    assert NodeConfig.model_validate({"learner": {"lr": 5e-5}}).learner.trace_lr == 5e-5
    smol = NodeConfig(model=ModelConfig(name="smollm2-135m"), learner=LearnerConfig(micro_batch_size=4))
    assert (smol.learner.lr, smol.learner.trace_lr, smol.learner.trace_batch) == (1e-5, 1e-5, 32)
    smol = NodeConfig.model_validate({"model": {"name": "smollm2-135m"}, "learner": {"trace_batch": 8}})
    assert (smol.learner.lr, smol.learner.trace_lr, smol.learner.trace_batch) == (1e-5, 1e-5, 8)
    own = NodeConfig.model_validate({"learner": {"trace_lr": 1e-3, "trace_own": True}, "sapo": {"trace_groups": 4}})
    assert (own.learner.trace_lr, own.learner.trace_batch, own.sapo.trace_groups) == (1e-3, 0, 4)  # set: kept
    for named in ({"peer_advantage": "receiver"}, {"external_groups": 8}, {"external_fraction": 0.5}):
        c = NodeConfig.model_validate({"sapo": named})
        assert (c.sapo.peer_advantage, c.sapo.trace_groups, c.learner.trace_lr) == ("receiver", 0, 0.0), named
        assert c.sapo.local_groups + c.sapo.external_groups == 16, named
    off = NodeConfig.model_validate({"sapo": {"trace_groups": 0}})  # peers' traces turned off: nothing from peers
    assert (off.sapo.external_groups, off.sapo.trace_groups, off.learner.trace_lr) == (0, 0, 0.0)
    alone = NodeConfig.model_validate({"sapo": {"external_groups": 0}})
    assert (alone.sapo.peer_advantage, alone.sapo.trace_groups, alone.sapo.local_groups) == ("receiver", 0, 16)
    with pytest.raises(ValidationError, match=r"trace_groups \(\d+\) needs the trace step"):
        NodeConfig.model_validate({"learner": {"trace_lr": 0}})  # the default's trace groups need it on


def test_registered_transfer_arms_resolve_to_the_settings_their_pairs_ran_with():
    """A default that changes is caught per arm by the experiment driver (a saved pair is reused only under its arm
    key); the peer-trace default must leave every registered transfer arm's resolved settings as they ran, so the
    committed pairs stay the experiment's and a resumed run pairs with them."""
    import json

    from sim.config import load_sim_config
    from sim.driver.pairs import arm_keys

    root = Path(__file__).resolve().parents[2]
    for name in ("transfer-het", "transfer-homo", "transfer-never"):
        sim = load_sim_config(str(root / "configs" / "sim" / f"{name}.yaml"), [])
        saved = json.loads((root / "benchmarks" / "results" / f"{name.replace('-', '_')}.json").read_text())
        keys = arm_keys(sim)
        assert keys == {a: saved["arm_keys"][a] for a in keys}, name
