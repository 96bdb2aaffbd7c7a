"""The reference-faithful RL options end to end: ppo.whiten, critic.value_mask, their validation,
the teacher-placement check and dev EM with the run's own rollout limits (tiny real models, CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from cli_helpers import assert_one_line_error, invoke  # noqa: E402
from test_rl_loop import rows, toy, write_rl_config  # noqa: E402,F401 - toy is a fixture

from dgpo_edge.train.rl.loop import RLTrainer, run_rl  # noqa: E402
from dgpo_edge.train.rl.config import load_rl_config  # noqa: E402


@pytest.mark.parametrize("overrides, message", [
    # *_full KLs are computed once without gradients: the loss form had nothing to differentiate
    # (it passed validation, then crashed at the first update)
    (["teacher.placement=loss", "teacher.estimator=reverse_full"], "teacher.placement"),
    (["teacher.placement=loss", "teacher.estimator=forward_full"], "teacher.placement"),
    (["ppo.whiten=global"], "one of reference, generated, none"),
    (["ppo.whiten=true"], "ppo.whiten"),
    (["critic.value_mask=all"], "critic.value_mask"),
])
def test_bad_combinations_are_refused_before_anything_is_written(toy, tmp_path, overrides, message):
    config = write_rl_config(toy, tmp_path / "run")
    assert_one_line_error(invoke("train", "dgpo", "--config", config, *overrides), message)
    assert not (tmp_path / "run").exists()


def test_defaults_are_the_reference_behaviour(toy, tmp_path):
    config = load_rl_config("ppo", write_rl_config(toy, tmp_path / "run"))
    assert (config.ppo.whiten, config.critic.value_mask) == ("reference", "reference")


@pytest.mark.parametrize("whiten, value_mask", [("reference", "reference"), ("generated", "generated"),
                                                ("none", "reference")])
def test_whiten_and_value_mask_options_train(toy, tmp_path, whiten, value_mask):
    out = tmp_path / "run"
    run_rl(load_rl_config("ppo", write_rl_config(toy, out, optim={"steps": 1}, ppo={"whiten": whiten},
                                                 critic={"value_mask": value_mask})))
    r = rows(out)[0]
    assert float(r["value_loss"]) > 0 and float(r["critic_grad_norm"]) > 0


def test_value_mask_changes_what_the_critic_learns(toy, tmp_path):
    losses = {}
    for mode in ("reference", "generated"):
        out = tmp_path / mode
        run_rl(load_rl_config("ppo", write_rl_config(toy, out, optim={"steps": 1}, critic={"value_mask": mode})))
        losses[mode] = float(rows(out)[0]["value_loss"])
    assert losses["reference"] != pytest.approx(losses["generated"], rel=1e-3)


def test_dev_em_uses_the_runs_rollout_limits(toy, tmp_path):
    config = load_rl_config("dgpo", write_rl_config(
        toy, tmp_path / "run", data={"dev": str(Path(toy) / "dev.jsonl")},
        protocol={"max_searches": 2, "max_turn_tokens": 33, "top_k": 2, "max_obs_tokens": 77}))
    protocol = RLTrainer(config).eval_fn().rollout.protocol
    assert (protocol.max_searches, protocol.max_turn_tokens, protocol.top_k, protocol.max_obs_tokens) == (2, 33, 2, 77)


def test_dgpo_with_lora_trains_adapters_saves_merged_and_resumes(toy, tmp_path):
    from safetensors.torch import load_file

    lora = {"r": 4, "alpha": 8.0}
    straight = tmp_path / "straight"
    run_rl(load_rl_config("dgpo", write_rl_config(toy, straight, optim={"steps": 2}, lora=lora)))
    resumed = tmp_path / "resumed"
    run_rl(load_rl_config("dgpo", write_rl_config(toy, resumed, optim={"steps": 1}, lora=lora)))
    run_rl(load_rl_config("dgpo", write_rl_config(toy, resumed, optim={"steps": 2}, lora=lora)))
    assert rows(resumed) == rows(straight)
    last = straight / "checkpoints" / "last"
    r = rows(straight)[-1]
    assert float(r["grad_norm"]) > 0 and float(r["critic_grad_norm"]) > 0
    base, merged = load_file(toy / "student" / "model.safetensors"), load_file(last / "model.safetensors")
    assert base.keys() == merged.keys()
    assert torch.equal(base["model.norm.weight"], merged["model.norm.weight"])        # frozen
    assert not torch.equal(base[QPROJ], merged[QPROJ])                               # + B @ A * 2
    assert (last / "adapter" / "adapter_model.safetensors").is_file()


QPROJ = "model.layers.0.self_attn.q_proj.weight"
