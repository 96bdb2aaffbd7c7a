"""LoRA (train/lora.py) on tiny real models: what trains, what a checkpoint holds, resume, every command."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")
pytest.importorskip("peft")

from cli_helpers import assert_one_line_error, invoke  # noqa: E402
from test_train_loop import _weights, toy  # noqa: E402,F401 - toy is a fixture: tiny student and teacher, toy data
from train_helpers import read_metrics, write_config  # noqa: E402

from dgpo_edge.train.config import KDConfig, LoRASection, SFTConfig, load_config  # noqa: E402
from dgpo_edge.train.lora import apply_lora, load_adapter  # noqa: E402

pytestmark = pytest.mark.slow

LORA = {"r": 4, "alpha": 8.0, "save_dtype": "f32"}   # scale alpha / r = 2


def _sft(toy, tmp_path, name="run", lora=LORA, **optim):
    from dgpo_edge.train.sft import run_sft

    settings = {"max_steps": 8, "batch_size": 4, "lr": 2e-2, "schedule": "constant", **optim}
    config = write_config(tmp_path / f"{name}.yaml", toy["student"], toy["train"], tmp_path / name,
                          optim=settings, lora=lora)
    run_sft(load_config(SFTConfig, config))
    return tmp_path / name


def _base(toy):
    from dgpo_edge.train.models import load_checkpoint

    return load_checkpoint(toy["student"])[0]


def test_only_adapters_train_and_norms_when_asked(toy):
    model = apply_lora(_base(toy), LoRASection(r=4))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    # 2 layers x 7 linear layers x (A, B)
    assert len(trainable) == 28 and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    model = apply_lora(_base(toy), LoRASection(r=4, train_norms=True, target_modules=["q_proj", "v_proj"]))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    norms = {n for n in trainable if "lora_" not in n}
    # 2 per layer and the final one
    assert norms == {f"model.layers.{i}.{k}.weight" for i in (0, 1)
                     for k in ("input_layernorm", "post_attention_layernorm")} | {"model.norm.weight"}
    assert len(trainable - norms) == 2 * 2 * 2


def test_evaluation_counts_the_parameters_a_merged_adapter_ships_with(toy):
    # report rows and factbook_eval rows give a student's size: an adapter merges into its weights
    from dgpo_edge.train.evaluation import _params

    base = _base(toy)
    n = sum(p.numel() for p in base.parameters())
    adapted = apply_lora(_base(toy), LoRASection(r=4))
    assert sum(p.numel() for p in adapted.parameters()) > n
    assert _params(adapted) == _params(base) == n


def test_sft_with_lora_learns_and_saves_merged_weights_and_the_adapter(toy, tmp_path):
    run = _sft(toy, tmp_path, lora={"r": 8, "alpha": 16.0, "save_dtype": "f32"}, max_steps=10)
    losses = [float(r["loss"]) for r in read_metrics(run / "metrics.csv")]
    # adapters on a random 32-wide model over a frozen 49k vocabulary learn slowly (10.81 -> 10.53 seen)
    assert losses[-1] < losses[0] - 0.15 and sum(losses[-3:]) < sum(losses[:3]) - 0.3, losses
    last = run / "checkpoints" / "last"
    base, merged = _weights(toy["student"]), _weights(last)
    assert base.keys() == merged.keys()                      # plain names: loadable by everything downstream
    from safetensors.torch import load_file

    adapter = load_file(last / "adapter" / "adapter_model.safetensors")
    changed = 0
    for key, w in base.items():
        module = key.removesuffix(".weight")
        a = adapter.get(f"base_model.model.{module}.lora_A.weight")
        if a is None:
            assert torch.equal(merged[key], w), key          # not adapted: untouched
            continue
        b = adapter[f"base_model.model.{module}.lora_B.weight"]
        torch.testing.assert_close(merged[key], w + b @ a * 2.0, rtol=0, atol=1e-6)
        changed += int(not torch.equal(merged[key], w))
    assert changed == 14
    config = json.loads((last / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (8, 16.0, "LORA")


def test_adapter_round_trip_gives_the_merged_models_logits(toy, tmp_path):
    from dgpo_edge.train.models import load_checkpoint

    run = _sft(toy, tmp_path, max_steps=3)
    last = run / "checkpoints" / "last"
    merged = load_checkpoint(last)[0].eval()
    rebuilt = load_adapter(_base(toy), last / "adapter").eval()
    ids = torch.tensor([[1, 50, 400, 2000, 7, 9]])
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(input_ids=ids).logits, merged(input_ids=ids).logits,
                                   rtol=0, atol=1e-4)


def test_adapter_file_holds_exactly_the_bf16_adapters(toy, tmp_path):
    run = _sft(toy, tmp_path, lora={"r": 4}, max_steps=1)
    path = run / "checkpoints" / "last" / "adapter" / "adapter_model.safetensors"
    raw = path.read_bytes()
    header_len = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + header_len])
    # per layer r x (in + out): q 32+32, k 32+16, v 32+16, o 32+32, gate 32+64, up 32+64, down 64+32
    # = 4 x 512 = 2,048 parameters; 2 layers, 2 bytes each
    assert len(raw) - 8 - header_len == 2 * 2048 * 2
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    assert not (path.parent / "norms.safetensors").exists()


def test_resume_continues_a_lora_run(toy, tmp_path):
    straight = _sft(toy, tmp_path, name="straight", max_steps=4)
    _sft(toy, tmp_path, name="resumed", max_steps=2)
    resumed = _sft(toy, tmp_path, name="resumed", max_steps=4)
    a = [float(r["loss"]) for r in read_metrics(straight / "metrics.csv")]
    b = [float(r["loss"]) for r in read_metrics(resumed / "metrics.csv")]
    assert len(b) == 4 and b == pytest.approx(a, abs=1e-5)
    assert json.loads((resumed / "checkpoints" / "last" / "trainer_state.json").read_text())["step"] == 4


def test_kd_with_lora_and_norms(toy, tmp_path):
    from dgpo_edge.train.kd import run_kd

    config = write_config(tmp_path / "kd.yaml", toy["student"], toy["train"], tmp_path / "run",
                          optim={"max_steps": 3, "batch_size": 4, "lr": 1e-2},
                          kd={"teacher": str(toy["teacher"])}, lora={"r": 2, "train_norms": True})
    run_kd(load_config(KDConfig, config))
    last = tmp_path / "run" / "checkpoints" / "last"
    base, merged = _weights(toy["student"]), _weights(last)
    assert not torch.equal(base["model.norm.weight"], merged["model.norm.weight"])
    assert torch.equal(base["model.embed_tokens.weight"], merged["model.embed_tokens.weight"])
    assert (last / "adapter" / "norms.safetensors").is_file()


@pytest.mark.parametrize("override, needle", [
    ("lora.r=-1", "lora.r"),
    ("lora.dropout=1", "lora.dropout"),
    ("lora.save_dtype=f8", "one of bf16, f16, f32"),
    ("lora.target_modules=[q_proj,nope]", "no module named nope"),
])
def test_lora_config_errors(toy, tmp_path, override, needle):
    config = write_config(tmp_path / "c.yaml", toy["student"], toy["train"], tmp_path / "run", lora={"r": 4})
    assert_one_line_error(invoke("train", "sft", "--config", config, override), needle)
    assert not (tmp_path / "run").exists()


def test_save_checkpoint_writes_the_merged_model_and_the_adapter(tmp_path):
    # The path `best` checkpoints take (lora.save_checkpoint), written atomically.
    from dgpo_edge.train.lora import save_checkpoint
    from dgpo_edge.train.models import load_checkpoint
    from test_rollout_support import tiny_model

    model = apply_lora(tiny_model("llama", 300, seed=1), LoRASection(r=4))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)   # peft starts B at zero: make the adapter change the outputs
    out = save_checkpoint(model, None, tmp_path / "best", extra={"step": 3})
    made = json.loads((out / "dgpo_edge.json").read_text())
    assert made["step"] == 3 and "adapter/adapter_model.safetensors" in made["files"]   # what it wrote
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    merged = load_checkpoint(out)[0].eval()
    ids = torch.tensor([[1, 5, 40, 200, 7]])
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, model.eval()(input_ids=ids).logits,
                                   rtol=0, atol=1e-4)


def test_model_merge_rebuilds_the_runs_merged_checkpoint(toy, tmp_path):
    """`dgpo-edge model merge BASE --adapter A --out D` gives the LoRA run's own merged weights,
    with the adapter kept beside them (what RL starts from when it starts from a shipped student)."""
    from dgpo_edge.train.models import load_checkpoint

    run = _sft(toy, tmp_path, lora={**LORA, "train_norms": True}, max_steps=3)
    last = run / "checkpoints" / "last"
    result = invoke("model", "merge", toy["student"], "--adapter", last / "adapter", "--out", tmp_path / "merged")
    assert result.exit_code == 0, result.output
    merged, tokenizer = load_checkpoint(tmp_path / "merged")
    expected = load_checkpoint(last)[0]
    assert tokenizer is not None and (tmp_path / "merged" / "adapter" / "adapter_config.json").is_file()
    ids = torch.tensor([[1, 50, 400, 2000, 7, 9]])
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, expected(input_ids=ids).logits, rtol=0, atol=1e-4)
        assert not torch.allclose(merged(input_ids=ids).logits, _base(toy)(input_ids=ids).logits, atol=1e-3)


def test_model_merge_refuses_an_adapter_of_another_depth(toy, tmp_path):
    """The toy teacher has 3 layers, the student 2: the student's adapter leaves a layer of the
    teacher without weights, and a 1-layer base has no place for the adapter's second layer."""
    from dgpo_edge.train.models import prune_checkpoint

    adapter = _sft(toy, tmp_path, max_steps=1) / "checkpoints" / "last" / "adapter"
    one_layer, _ = prune_checkpoint(toy["student"], tmp_path / "one-layer", layers=[0])
    for base, needle in ((toy["teacher"], "are not in it"), (one_layer, "have no place in it")):
        result = invoke("model", "merge", base, "--adapter", adapter, "--out", tmp_path / "merged")
        assert_one_line_error(result, "adapter does not fit", needle, "adapter")
        assert not (tmp_path / "merged").exists()
    # in a process of its own too (where a library's deprecation warnings would show): one line
    r = subprocess.run([sys.executable, "-m", "dgpo_edge", "model", "merge", str(toy["teacher"]), "--adapter",
                        str(adapter), "--out", str(tmp_path / "merged")], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # nor over its own base: the merged model would replace the base it was made from
    before = sorted((p.name, p.stat().st_size) for p in one_layer.iterdir())
    result = invoke("model", "merge", one_layer, "--adapter", adapter, "--out", one_layer)
    assert_one_line_error(result, "is also this command's input")
    assert sorted((p.name, p.stat().st_size) for p in one_layer.iterdir()) == before
    # an adapter path that is not there, or is the adapter's config file, is named for what it is
    for wrong, needle in ((tmp_path / "nope", "no such adapter folder"), (adapter / "adapter_config.json", "is a file")):
        result = invoke("model", "merge", one_layer, "--adapter", wrong, "--out", tmp_path / "merged")
        assert_one_line_error(result, str(wrong), needle)


def test_model_merge_names_a_broken_adapter_file_before_loading_the_base(toy, tmp_path, monkeypatch):
    """An adapter folder missing its weights, with a cut weights file, a config without its keys or
    norms of another model: one error line naming the file (not a safetensors/KeyError traceback),
    before the base model is loaded."""
    import shutil

    from safetensors.torch import save_file

    from dgpo_edge.train import models
    from dgpo_edge.train.lora import save_adapter

    good = tmp_path / "good"
    save_adapter(apply_lora(_base(toy), LoRASection(**LORA, train_norms=True)), good)

    def broken(name, damage):
        folder = tmp_path / name
        shutil.copytree(good, folder)
        damage(folder)
        return folder

    cases = [
        (broken("no-weights", lambda f: (f / "adapter_model.safetensors").unlink()),
         "adapter_model.safetensors", "no such file"),
        (broken("cut", lambda f: (f / "adapter_model.safetensors").write_bytes(b"\x10\x00")),
         "adapter_model.safetensors", "not a readable safetensors file"),
        (broken("no-rank", lambda f: (f / "adapter_config.json").write_text('{"r": 4}')),
         "adapter_config.json", "lora_alpha"),
    ]
    norms_of_another = broken("other-norms", lambda f: save_file({"model.nope.weight": torch.ones(3)},
                                                                 str(f / "norms.safetensors")))
    real_load = models.load_checkpoint
    monkeypatch.setattr(models, "load_checkpoint", lambda *a, **k: pytest.fail("loaded the base first"))
    for adapter, name, needle in cases:
        result = invoke("model", "merge", toy["student"], "--adapter", adapter, "--out", tmp_path / "merged")
        assert_one_line_error(result, str(adapter / name), needle)
    monkeypatch.setattr(models, "load_checkpoint", real_load)   # norms fit or not only against the model
    result = invoke("model", "merge", toy["student"], "--adapter", norms_of_another, "--out", tmp_path / "merged")
    assert_one_line_error(result, str(norms_of_another / "norms.safetensors"), "model.nope.weight")
    assert not (tmp_path / "merged").exists()


def test_sft_continues_a_saved_adapter(toy, tmp_path):
    """lora.init_from: the second run starts from the first run's adapter (same rank, norms
    trained) over the same base, so before it moves its model is the first run's merged model."""
    from dgpo_edge.train.models import load_checkpoint

    first = _sft(toy, tmp_path, name="first", lora={**LORA, "train_norms": True}, max_steps=3)
    adapter = first / "checkpoints" / "last" / "adapter"
    second = _sft(toy, tmp_path, name="second", lora={"init_from": str(adapter), "save_dtype": "f32"},
                  max_steps=1, lr=1e-9)
    saved = json.loads((second / "checkpoints" / "last" / "adapter" / "adapter_config.json").read_text())
    assert saved["r"] == 4 and saved["lora_alpha"] == 8.0
    assert (second / "checkpoints" / "last" / "adapter" / "norms.safetensors").is_file()
    ids = torch.tensor([[1, 50, 400, 2000, 7, 9]])
    with torch.no_grad():
        torch.testing.assert_close(load_checkpoint(second / "checkpoints" / "last")[0](input_ids=ids).logits,
                                   load_checkpoint(first / "checkpoints" / "last")[0](input_ids=ids).logits,
                                   rtol=0, atol=1e-4)


@pytest.mark.parametrize("lora, needle", [
    ({}, "not an adapter folder"),
    ({"r": 4}, "leave lora.r at 0"),
])
def test_lora_init_from_errors(toy, tmp_path, lora, needle):
    config = write_config(tmp_path / "c.yaml", toy["student"], toy["train"], tmp_path / "run", lora=lora)
    assert_one_line_error(invoke("train", "sft", "--config", config, f"lora.init_from={tmp_path}"),
                          "lora.init_from", needle)
    assert not (tmp_path / "run").exists()
