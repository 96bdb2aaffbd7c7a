"""Training configs: YAML + overrides, validation errors naming the file and key, exit status 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, invoke
from dgpo_edge.train.config import (
    KDConfig,
    SFTConfig,
    load_config,
    write_resolved,
)
from dgpo_edge.train.models import resolve_path

from dgpo_edge.errors import InputError

CONFIGS = Path(__file__).resolve().parents[1] / "train" / "configs"
GOOD = "run: {out_dir: out/x}\nmodel: {path: m}\ndata: {train: t.jsonl}\n"


def _yaml(tmp_path, text, name="c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults_overrides_and_yaml_floats(tmp_path):
    path = _yaml(tmp_path, GOOD + "optim: {lr: 1e-5, batch_size: 4}\nkd: {teacher: t}\n")
    c = load_config(KDConfig, path, ["optim.grad_accum=8", "kd.loss=jsd", "data.limit=null", "chunk_size=0"])
    assert c.optim.lr == 1e-5 and isinstance(c.optim.lr, float)  # YAML 1.1 reads "1e-5" as a string
    assert (c.optim.batch_size, c.optim.grad_accum, c.kd.loss, c.chunk_size) == (4, 8, "jsd", 0)
    assert c.data.limit is None and c.optim.schedule == "cosine" and c.kd.temperature == 1.0


def test_resolved_config_round_trips(tmp_path):
    c = load_config(SFTConfig, _yaml(tmp_path, GOOD), ["model.random_init={num_hidden_layers: 2}"])
    written = write_resolved(c, tmp_path / "run")
    assert written.read_text().startswith("# resolved sft config")
    assert load_config(SFTConfig, written) == c


@pytest.mark.parametrize("text, overrides, needle", [
    (GOOD + "optim: {lrr: 1}\n", [], "unknown key 'optim.lrr'"),
    (GOOD + "bogus: {}\n", [], "unknown key 'bogus'"),
    (GOOD + "optim: 3\n", [], "'optim' must be a mapping"),
    (GOOD + "optim: {batch_size: two}\n", [], "key 'optim.batch_size' must be an integer"),
    (GOOD + "optim: {batch_size: 1.5}\n", [], "key 'optim.batch_size' must be an integer"),
    (GOOD.replace("out_dir: out/x", "out_dir: x, resume: maybe"), [], "key 'run.resume' must be true/false"),
    (GOOD, ["optim.lr=abc"], "override 'optim.lr' must be a number"),
    (GOOD, ["optim.nope=1"], "override 'optim.nope': unknown key"),
    (GOOD, ["nope.lr=1"], "override 'nope': unknown section"),
    (GOOD, ["optim.lr"], "is not key=value"),
    (GOOD, ["optim.lr=0"], "key 'optim.lr' must be > 0"),
    (GOOD, ["optim.schedule=step"], "override 'optim.schedule' must be one of"),
    (GOOD, ["optim.warmup_ratio=1"], "key 'optim.warmup_ratio'"),
    (GOOD, ["data.dev=dev.jsonl"], "key 'data.retriever' is required"),
    (GOOD, ["data.report=test.jsonl"], "key 'data.retriever' is required"),
    ("run: {out_dir: x}\nmodel: {path: m}\n", [], "key 'data.train' is required"),
    ("- a\n- b\n", [], "expected a mapping"),
    ("run: [unclosed\n", [], "malformed YAML"),
    (GOOD, ["log.save_minutes=-1"], "key 'log.save_minutes' must be >= 0"),
])
def test_validation_errors_name_the_file_and_key(tmp_path, text, overrides, needle):
    path = _yaml(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_config(SFTConfig, path, overrides)
    assert needle in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize("overrides, needle", [
    ([], "key 'kd.teacher' is required"),
    (["kd.teacher=t", "kd.loss=kl"], "override 'kd.loss' must be one of"),
    (["kd.teacher=t", "kd.jsd_beta=1"], "key 'kd.jsd_beta'"),
    (["kd.teacher=t", "kd.on_policy=0.5", "kd.loss=seqkd"], "needs a soft-target loss"),
    (["kd.teacher=t", "kd.temperature=0"], "key 'kd.temperature'"),
])
def test_kd_validation(tmp_path, overrides, needle):
    with pytest.raises(InputError, match=needle):
        load_config(KDConfig, _yaml(tmp_path, GOOD), overrides)


def test_shipped_configs_are_valid():
    from dgpo_edge.train.rl.config import load_rl_config

    stages = {"sft": SFTConfig, "kd": KDConfig}
    names = sorted(p.name for p in CONFIGS.glob("*.yaml") if not p.name.startswith("accelerate-"))
    assert {"tiny-cpu-sft.yaml", "tiny-cpu-kd.yaml", "factbook-teacher-sft.yaml", "factbook-kd.yaml",
            "qwen2.5-3b-to-0.5b-kd.yaml", "tiny-cpu-dgpo.yaml", "factbook-dgpo.yaml", "factbook-ppo.yaml",
            "qwen2.5-3b-to-0.5b-dgpo.yaml"} <= set(names)
    for name in names:
        text = (CONFIGS / name).read_text()
        header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
        launch = re.search(rf"train (sft|kd|ppo|dgpo|grpo) --config train/configs/{re.escape(name)}", header)
        assert launch, name
        stage = launch.group(1)
        if stage in stages:
            load_config(stages[stage], CONFIGS / name)
        else:
            load_rl_config(stage, CONFIGS / name)


def test_pkg_paths_resolve_inside_an_installed_package():
    assert resolve_path("pkg://dgpo_edge/protocol.py").endswith("dgpo_edge/protocol.py")
    assert resolve_path("plain/path") == "plain/path"
    with pytest.raises(InputError, match="not installed"):
        resolve_path("pkg://no_such_package_xyz/file.gguf")


# --- through the CLI: one `error:` line, exit status 2 ---------------------------------------

def test_cli_missing_config(tmp_path):
    result = invoke("train", "sft", "--config", tmp_path / "nope.yaml")
    assert_one_line_error(result, "nope.yaml", "no such config file")


def test_cli_bad_key_and_override(tmp_path):
    path = _yaml(tmp_path, GOOD + "optim: {lrr: 1}\n")
    assert_one_line_error(invoke("train", "sft", "--config", path), "c.yaml", "unknown key 'optim.lrr'")
    path = _yaml(tmp_path, GOOD + "kd: {teacher: t}\n", "k.yaml")
    assert_one_line_error(invoke("train", "kd", "--config", path, "kd.loss=bogus"), "k.yaml", "kd.loss")


def test_cli_missing_model_and_bad_trajectories(tmp_path):
    path = _yaml(tmp_path, f"run: {{out_dir: {tmp_path / 'run'}}}\nmodel: {{path: {tmp_path / 'no-model'}}}\n"
                           f"data: {{train: {tmp_path / 't.jsonl'}}}\n")
    (tmp_path / "t.jsonl").write_text("")   # named first now, before any model (the next test)
    assert_one_line_error(invoke("train", "sft", "--config", path), "t.jsonl", "no trajectories")
    (tmp_path / "t.jsonl").write_text('{"question": "q", "segments": [{"kind": "turn", "text": "t"}]}\n')
    assert_one_line_error(invoke("train", "sft", "--config", path), "no-model", "no such model")
    assert not (tmp_path / "run").exists()  # nothing written before the inputs are known good


@pytest.mark.parametrize("stage, extra", [("sft", ""), ("kd", "kd: {teacher: no-teacher}\n"),
                                          ("ppo", "rollout: {prompts_per_step: 256}\n")])
def test_a_missing_data_file_is_named_by_its_key_before_any_model_loads(tmp_path, stage, extra):
    """The error named the path alone, and came after the model (and a KD run's teacher) had loaded."""
    (tmp_path / "t.jsonl").write_text("")
    path = _yaml(tmp_path, f"run: {{out_dir: {tmp_path / 'run'}}}\nmodel: {{path: {tmp_path / 'no-model'}}}\n"
                           f"data: {{train: {tmp_path / 't.jsonl'}, dev: {tmp_path / 'dev.jsonl'}, retriever: c.jsonl}}\n{extra}")
    assert_one_line_error(invoke("train", stage, "--config", path), "dev.jsonl", "data.dev: no such file")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("stage, extra", [("sft", ""), ("kd", "kd: {teacher: no-teacher}\n")])
@pytest.mark.parametrize("key, text, needle", [
    ("train", '{"question": "q", "segments": [{"kind": "turn", "text": "t"}]}\n{oops\n', "t.jsonl, line 2: malformed JSON"),
    ("train", '{"question": "q", "golden_answers": ["a"]}\n', "t.jsonl, line 1: missing 'segments'"),  # a QA file
    ("train", "\n", "t.jsonl: data.train: no trajectories in this file"),
    ("dev", '{"question": "q", "golden_answers": ["a"]}\n[1]\n', "dev.jsonl, line 2: expected a JSON object"),
    ("report", '{oops\n', "dev.jsonl, line 1: malformed JSON"),
])
def test_bad_rows_are_named_before_any_model_loads(tmp_path, stage, extra, key, text, needle):
    """A bad line of data.train, data.dev or data.report was named only once the model (and a KD
    run's teacher) had loaded: here the model does not exist, and the line is still what is named."""
    good = '{"question": "q", "golden_answers": ["a"], "segments": [{"kind": "turn", "text": "t"}]}\n'
    files = {"train": tmp_path / "t.jsonl", "dev": tmp_path / "dev.jsonl", "report": tmp_path / "dev.jsonl"}
    files["train"].write_text(good)
    files[key].write_text(text)
    split = "" if key == "train" else f", {key}: {files[key]}, retriever: c.jsonl"
    path = _yaml(tmp_path, f"run: {{out_dir: {tmp_path / 'run'}}}\nmodel: {{path: {tmp_path / 'no-model'}}}\n"
                           f"data: {{train: {files['train']}{split}}}\n{extra}")
    assert_one_line_error(invoke("train", stage, "--config", path), needle)
    assert not (tmp_path / "run").exists()


RL_GOOD = (GOOD.replace("data: {train: t.jsonl}\n", "data: {train: t.jsonl, retriever: corpus.jsonl}\n")
           + "teacher: {path: t}\n")


@pytest.mark.parametrize("text, overrides, key", [
    (GOOD + "optim: {lr: .nan}\n", [], "optim.lr"),
    (GOOD + "optim: {lr: .inf}\n", [], "optim.lr"),
    (GOOD, ["optim.lr=nan"], "optim.lr"),
    (GOOD, ["optim.lr=inf"], "optim.lr"),
    (GOOD, ["optim.grad_clip=-inf"], "optim.grad_clip"),
    (GOOD, ["optim.epochs=1e999"], "optim.epochs"),
    (GOOD, ["model.random_init={rope_theta: .inf}"], "model.random_init.rope_theta"),
])
def test_non_finite_numbers_are_refused(tmp_path, text, overrides, key):
    with pytest.raises(InputError) as info:
        load_config(SFTConfig, _yaml(tmp_path, text), overrides)
    assert f"'{key}'" in str(info.value) and "finite" in str(info.value)


@pytest.mark.parametrize("override, key", [
    ("teacher.beta=nan", "teacher.beta"), ("teacher.beta=inf", "teacher.beta"),
    ("optim.lr=inf", "optim.lr"), ("ppo.kl_ref=.inf", "ppo.kl_ref"),
    ("rollout.top_p=nan", "rollout.top_p"),
])
def test_rl_non_finite_numbers_are_refused(tmp_path, override, key):
    from dgpo_edge.train.rl.config import load_rl_config

    path = _yaml(tmp_path, RL_GOOD)
    load_rl_config("dgpo", path, ["rollout.prompts_per_step=256"])   # the base is valid
    with pytest.raises(InputError) as info:
        load_rl_config("dgpo", path, [override])
    assert f"'{key}'" in str(info.value) and "finite" in str(info.value)


def test_an_algorithm_override_must_be_the_commands(tmp_path):
    """`train dgpo ... algorithm=ppo` ran DGPO without a word (the command's own value came last)."""
    from dgpo_edge.train.rl.config import load_rl_config

    path = _yaml(tmp_path, RL_GOOD)
    base = ["rollout.prompts_per_step=256"]
    for same in ("algorithm=dgpo", "algorithm='dgpo'"):   # quoted as YAML, the same value
        assert load_rl_config("dgpo", path, [*base, same]).algorithm == "dgpo"
    with pytest.raises(InputError, match=r"override algorithm=ppo: this is `train dgpo`"):
        load_rl_config("dgpo", path, [*base, "algorithm=ppo"])


def test_a_key_given_twice_is_refused_with_its_line(tmp_path):
    """YAML keeps the last of two equal keys without a word: a second `optim:` section further down
    replaced the first whole, and a second `lr:` overrode the first."""
    from dgpo_edge.train.rl.config import load_rl_config

    twice = GOOD + "optim: {lr: 1.0e-4}\noptim: {max_steps: 5}\n"
    with pytest.raises(InputError) as info:
        load_config(SFTConfig, _yaml(tmp_path, twice))
    assert "key 'optim' is given twice" in str(info.value) and "c.yaml, line 5:" in str(info.value)
    nested = GOOD + "optim:\n  lr: 1.0e-4\n  max_steps: 5\n  lr: 2.0e-4\n"
    with pytest.raises(InputError, match=r"c\.yaml, line 7: .*key 'lr' is given twice"):
        load_config(SFTConfig, _yaml(tmp_path, nested))
    # YAML's merge key is no repetition: keys merged from an anchor, and a key overriding one of them
    merged = (GOOD + "base: &b {lr: 1.0e-4, max_steps: 5}\nsft: &sft {<<: *b, lr: 2.0e-4}\n"
              "optim:\n  <<: [*sft]\n  batch_size: 4\n")
    from dgpo_edge.train.config import read_config_yaml
    assert read_config_yaml(_yaml(tmp_path, merged))["optim"] == {"lr": 2.0e-4, "max_steps": 5, "batch_size": 4}
    rl = _yaml(tmp_path, RL_GOOD + "rollout: {prompts_per_step: 256}\n", "rl.yaml")
    assert load_rl_config("dgpo", rl).rollout.prompts_per_step == 256
    rl.write_text(rl.read_text() + "algorithm: ppo\nalgorithm: dgpo\n")
    with pytest.raises(InputError, match="key 'algorithm' is given twice"):
        load_rl_config("dgpo", rl)


def test_rl_config_reads_its_file_once(tmp_path, monkeypatch):
    """The algorithm check read the YAML a second time: an edit in between (here: right after the
    first read) was taken for the file's algorithm, and a broken file would be reported twice."""
    from dgpo_edge.train.rl.config import load_rl_config

    path = _yaml(tmp_path, RL_GOOD + "algorithm: dgpo\n", "rl.yaml")
    reads = []
    read_text = Path.read_text

    def read_then_edit(self, *args, **kwargs):
        text = read_text(self, *args, **kwargs)
        if self == path:
            reads.append(text)
            self.write_text(RL_GOOD + "algorithm: ppo\n")   # edited while the config loads
        return text

    monkeypatch.setattr(Path, "read_text", read_then_edit)
    config = load_rl_config("dgpo", path, ["rollout.prompts_per_step=256"])
    assert config.algorithm == "dgpo" and len(reads) == 1


def test_rl_checks_its_schedule_as_sft_does(tmp_path):
    from dgpo_edge.train.rl.config import load_rl_config

    path = _yaml(tmp_path, RL_GOOD)
    for override, key in (("log.save_minutes=-1", "log.save_minutes"), ("log.every=0", "log.every"),
                          ("eval.every=-1", "eval.every")):
        with pytest.raises(InputError, match=f"key '{key}' must be"):
            load_rl_config("dgpo", path, ["rollout.prompts_per_step=256", override])


def test_rl_points_model_compile_to_ppo_compile(tmp_path):
    """ModelSection is shared with SFT/KD, whose compile switch RL would silently ignore."""
    from dgpo_edge.train.rl.config import load_rl_config

    path = _yaml(tmp_path, RL_GOOD)
    assert load_rl_config("dgpo", path, ["rollout.prompts_per_step=256", "ppo.compile=true"]).ppo.compile
    with pytest.raises(InputError) as info:
        load_rl_config("dgpo", path, ["rollout.prompts_per_step=256", "model.compile=true"])
    assert "'model.compile'" in str(info.value) and "ppo.compile" in str(info.value)


def test_rl_refuses_lora_dropout(tmp_path):
    """Dropout would make the old log-probs (scored in training mode) and the update's differ."""
    from dgpo_edge.train.rl.config import load_rl_config

    path = _yaml(tmp_path, RL_GOOD)
    base = ["rollout.prompts_per_step=256", "lora.r=8"]
    assert load_rl_config("ppo", path, base + ["lora.dropout=0"]).lora.r == 8
    with pytest.raises(InputError) as info:
        load_rl_config("ppo", path, base + ["lora.dropout=0.05"])
    assert "'lora.dropout'" in str(info.value) and "ratio" in str(info.value)
    adapter = tmp_path / "adapter"   # an adapter to continue brings its own dropout
    adapter.mkdir()
    for dropout, refused in ((0.0, False), (0.1, True)):
        (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 8, "lora_dropout": dropout}))
        start = ["rollout.prompts_per_step=256", f"lora.init_from={adapter}"]
        if refused:
            with pytest.raises(InputError, match="lora.dropout"):
                load_rl_config("ppo", path, start)
        else:
            assert load_rl_config("ppo", path, start).lora.init_from == str(adapter)
    (adapter / "adapter_config.json").write_text("{not json")   # one clear error, not a traceback
    with pytest.raises(InputError, match="not an adapter config"):
        load_rl_config("ppo", path, ["rollout.prompts_per_step=256", f"lora.init_from={adapter}"])


def test_a_run_dir_where_a_file_stands_is_named(tmp_path):
    """run.out_dir a file, or under one (`mkdir` failed there, after the model had loaded): one error
    naming the file, which user_errors prints as one line, exit 2."""
    from dgpo_edge.train.plumbing import check_run_dir

    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    with pytest.raises(InputError, match="run.out_dir exists and is not a folder") as e:
        check_run_dir(notes)
    assert e.value.path == str(notes)
    with pytest.raises(InputError, match=r"is not a folder, so run.out_dir .*notes.txt/runs/a cannot be made") as e:
        check_run_dir(notes / "runs" / "a")
    assert e.value.path == str(notes)
    assert notes.read_text() == "mine"
    link = tmp_path / "gone"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(InputError, match="not a folder") as e:
        check_run_dir(link / "run")
    assert e.value.path == str(link)
    check_run_dir(tmp_path / "new" / "run")   # folders yet to be made are fine


@pytest.mark.parametrize("override, needle", [
    # a seed past int64 once multiplied stopped the run with torch's traceback after the model loaded
    ("run.seed=99999999999999", "key 'run.seed' must be in [0, 4294967295]"),
    ("run.seed=-1", "key 'run.seed' must be in [0, 4294967295]"),
    # RL: islice's traceback; SFT: "no usable trajectories (0 rows, ...)" after loading, naming no key
    ("data.limit=-3", "key 'data.limit' must be >= 1 (or null: every row)"),
    ("data.limit=0", "key 'data.limit' must be >= 1"),
    ("data.dev_limit=-1", "key 'data.dev_limit' must be >= 1"),
    ("data.report_limit=0", "key 'data.report_limit' must be >= 1"),
    # a section set to a value: "must be <class 'dgpo_edge.train.config.OptimSection'>, got 3"
    ("optim=3", "override 'optim' names a section: set one of its keys, optim.KEY=VALUE (known: "),
    ("model.random_init.num_hidden_layers=1", "set it whole, as model.random_init={KEY: VALUE, ...}"),
])
@pytest.mark.parametrize("stage", ["sft", "dgpo"])
def test_seeds_limits_and_sections_are_refused_naming_the_key(tmp_path, override, needle, stage):
    from dgpo_edge.train.rl.config import load_rl_config

    load = (lambda o: load_config(SFTConfig, _yaml(tmp_path, GOOD), o)) if stage == "sft" else \
        (lambda o: load_rl_config("dgpo", _yaml(tmp_path, RL_GOOD), ["rollout.prompts_per_step=256", *o]))
    load(["data.limit=1", "run.seed=4294967295"])   # the edges of the ranges load
    with pytest.raises(InputError) as info:
        load([override])
    assert needle in str(info.value) and "c.yaml" in str(info.value)


def test_a_model_that_cannot_load_is_named_by_its_key_before_any_loads(tmp_path):
    """A teacher or critic path with a typo was found only after the student (and critic) had loaded,
    as "no such tokenizer directory"; a folder that holds no model stopped with transformers' own
    message and exit status 1."""
    from dgpo_edge.train.plumbing import check_model_paths
    from dgpo_edge.train.rl.config import load_rl_config

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    (tmp_path / "data").mkdir()
    base = ["rollout.prompts_per_step=256", f"model.path={model}", f"teacher.path={model}"]
    check_model_paths(load_rl_config("dgpo", _yaml(tmp_path, RL_GOOD), base))   # all there
    for override, key, why in [(f"teacher.path={tmp_path / 'nope'}", "teacher.path", "no such model file"),
                               (f"critic.path={tmp_path / 'nope'}", "critic.path", "no such model file"),
                               (f"teacher.path={tmp_path / 'data'}", "teacher.path", "no config.json"),
                               (f"model.path={tmp_path / 'c.yaml'}", "model.path", "not a model folder or a .gguf"),
                               (f"model.tokenizer={tmp_path / 'data'}", "model.tokenizer", "no tokenizer")]:
        with pytest.raises(InputError) as info:
            check_model_paths(load_rl_config("dgpo", _yaml(tmp_path, RL_GOOD), [*base, override]))
        assert f"{key}: " in info.value.message and why in info.value.message, (override, str(info.value))
    kd = load_config(KDConfig, _yaml(tmp_path, GOOD), [f"model.path={model}", f"kd.teacher={tmp_path / 'data'}"])
    with pytest.raises(InputError, match="kd.teacher: not a transformers model folder"):
        check_model_paths(kd)
    check_model_paths(load_rl_config("ppo", _yaml(tmp_path, RL_GOOD), base[:2]))   # ppo loads no teacher
    # through the CLI: one line, exit 2, before anything loads or is written
    config = _yaml(tmp_path, f"run: {{out_dir: {tmp_path / 'run'}}}\nmodel: {{path: {model}}}\n"
                             f"data: {{train: {tmp_path / 'c.yaml'}, retriever: c.jsonl}}\n"
                             f"teacher: {{path: {tmp_path / 'data'}}}\nrollout: {{prompts_per_step: 256}}\n", "r.yaml")
    assert_one_line_error(invoke("train", "dgpo", "--config", config), "teacher.path: not a transformers model folder")
    assert not (tmp_path / "run").exists()


def test_old_protocol_keys_load_with_a_warning_naming_the_new_key(tmp_path, capsys):
    from dgpo_edge.train.rl.config import load_rl_config

    path = _yaml(tmp_path, RL_GOOD + "rollout: {max_searches: 2, max_turn_tokens: 33}\n")
    c = load_rl_config("dgpo", path, [])
    assert (c.protocol.max_searches, c.protocol.max_turn_tokens) == (2, 33)
    err = capsys.readouterr().err
    assert "key 'rollout.max_searches' is deprecated, use 'protocol.max_searches'" in err
    # An override in the old spelling moves too; old and new together are refused.
    c = load_rl_config("dgpo", _yaml(tmp_path, RL_GOOD, "b.yaml"), ["rollout.top_k=2"])
    assert c.protocol.top_k == 2
    both = _yaml(tmp_path, RL_GOOD + "rollout: {top_k: 2}\nprotocol: {top_k: 3}\n", "c.yaml")
    with pytest.raises(InputError, match="set only 'protocol.top_k'"):
        load_rl_config("dgpo", both, [])


@pytest.mark.parametrize("override, needle", [
    # accepted, then overflowing in the schedule, torch's int64 and the progress ETA
    ("optim.max_steps=100000000000000000000", "key 'optim.max_steps' must be at most 1,000,000,000, got 1"),
    ("optim.max_steps=1000000001", "key 'optim.max_steps' must be at most 1,000,000,000"),
    ("optim.epochs=1e20", "key 'optim.epochs' must be at most 1,000,000,000"),
])
def test_a_step_count_past_the_bound_is_refused_naming_the_key(tmp_path, override, needle):
    path = _yaml(tmp_path, GOOD)
    assert load_config(SFTConfig, path, ["optim.max_steps=1000000000"]).optim.max_steps == 10**9   # the bound loads
    with pytest.raises(InputError) as info:
        load_config(SFTConfig, path, [override])
    assert needle in str(info.value) and str(path) in str(info.value)


def test_epochs_past_the_bound_are_not_refused_when_max_steps_sets_the_steps(tmp_path):
    """optim.epochs is read only with optim.max_steps=0, but it was checked against the bound always."""
    config = load_config(SFTConfig, _yaml(tmp_path, GOOD), ["optim.max_steps=5", "optim.epochs=1e20"])
    assert (config.optim.max_steps, config.optim.epochs) == (5, 1e20)


def test_rl_steps_past_the_bound_are_refused_naming_the_key(tmp_path):
    from dgpo_edge.train.rl.config import load_rl_config

    path = _yaml(tmp_path, RL_GOOD)
    base = ["rollout.prompts_per_step=256"]
    assert load_rl_config("dgpo", path, [*base, "optim.steps=1000000000"]).optim.steps == 10**9
    with pytest.raises(InputError, match=r"key 'optim.steps' must be at most 1,000,000,000, got 100,000"):
        load_rl_config("dgpo", path, [*base, "optim.steps=100000000000000000000"])


def test_a_micro_batch_larger_than_the_mini_batch_is_refused_naming_both(tmp_path):
    """The loop cut micro-batches from each mini-batch, so a larger one was silently the mini-batch."""
    from dgpo_edge.train.rl.config import load_rl_config

    path = _yaml(tmp_path, RL_GOOD)
    base = ["rollout.prompts_per_step=256", "ppo.mini_batch=64"]
    assert load_rl_config("dgpo", path, [*base, "ppo.micro_batch=64"]).ppo.micro_batch == 64
    with pytest.raises(InputError) as info:
        load_rl_config("dgpo", path, [*base, "ppo.micro_batch=128"])
    assert "key 'ppo.micro_batch' (128) must be at most ppo.mini_batch (64)" in str(info.value)
    # and a mini-batch of 0 is its own line, not the ZeroDivisionError of the divisibility check
    with pytest.raises(InputError, match="key 'ppo.mini_batch' must be >= 1"):
        load_rl_config("dgpo", path, ["rollout.prompts_per_step=256", "ppo.mini_batch=0"])
