"""bench/lease/bring.sh: a packed student's pieces split over device calls of at most 8 files each,
then joined and checked here by the real `bench/factbook_rows.sh unpack`."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAME = "rl-dgpo-s0"
FILE = f"{NAME}.q8_0.gguf"


@pytest.fixture
def machine(tmp_path):
    """A GPU machine's checkout (the script alone) whose out/pack holds 9 pieces and the sha256."""
    (tmp_path / "bench" / "lease").mkdir(parents=True)
    shutil.copy(ROOT / "bench" / "lease" / "bring.sh", tmp_path / "bench" / "lease")
    pack = tmp_path / "out" / "pack"
    pack.mkdir(parents=True)
    data = os.urandom(9 * 1000 - 7)
    (pack / f"{FILE}.sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {FILE}\n")
    for i in range(9):   # what pack's `split -d` names them: .part00, .part01, ...
        (pack / f"{FILE}.part{i:02d}").write_bytes(data[i * 1000:(i + 1) * 1000])
    return tmp_path


def bring(machine: Path, *args: str, out: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    if out is not None:
        env["OUT"] = str(out)
    return subprocess.run(["bash", str(machine / "bench" / "lease" / "bring.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_pieces_come_back_in_calls_of_eight_files_and_join_to_the_packed_file(machine, tmp_path):
    listing = bring(machine, NAME)
    assert listing.returncode == 0, listing.stderr
    assert [line.split(":")[0] for line in listing.stdout.splitlines()] == ["call 1 of 2", "call 2 of 2"]
    here = tmp_path / "here"
    here.mkdir()
    for k in (1, "02"):   # each call's $OUT, gathered here in one folder (a K of 02 is 2, not octal)
        out = tmp_path / f"call{k}"
        out.mkdir()
        done = bring(machine, NAME, str(k), out=out)
        assert done.returncode == 0, done.stderr
        got = sorted(p.name for p in out.iterdir())
        assert len(got) == (8 if k == 1 else 2) and "octal" not in done.stderr
        for p in out.iterdir():
            shutil.copy(p, here)
    assert len(list(here.iterdir())) == 10
    joined = subprocess.run(["bash", str(ROOT / "bench" / "factbook_rows.sh"), "unpack", str(here), NAME],
                            capture_output=True, text=True, timeout=120)
    assert joined.returncode == 0, joined.stderr
    assert "OK" in joined.stdout
    assert (here / FILE).read_bytes() == b"".join(
        (machine / "out" / "pack" / f"{FILE}.part{i:02d}").read_bytes() for i in range(9))


@pytest.mark.parametrize("args, needs_out, says", [
    (("rl-ppo-s9",), False, "no pieces of rl-ppo-s9.q8_0.gguf"),
    ((NAME, "3"), True, "K must be 1 to 2"),
    ((NAME, "x"), True, "K must be 1 to 2"),
    ((NAME, "1"), False, "OUT is not set"),
])
def test_bad_requests_get_one_error_and_status_2(machine, tmp_path, args, needs_out, says):
    out = tmp_path / "o"
    out.mkdir()
    done = bring(machine, *args, out=out if needs_out else None)
    assert done.returncode == 2
    assert says in done.stderr
    assert not list(out.iterdir())   # nothing copied


def test_pack_names_a_variants_checkpoint_so_that_a_call_returns_its_pieces(tmp_path):
    """`factbook_rows.sh pack RUN/checkpoints/best` names the pieces RUN-best; a run of a DGPO variant
    (worlds-dgpo-all-24l+lr5e5) has a '+', which a device call refuses in a file's name."""
    (tmp_path / "bench" / "lease").mkdir(parents=True)
    shutil.copy(ROOT / "bench" / "factbook_rows.sh", tmp_path / "bench")
    shutil.copy(ROOT / "bench" / "lease" / "bring.sh", tmp_path / "bench" / "lease")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"lora")
    exporter = tmp_path / "python"   # stands in for `python -m dgpo_edge export gguf DIR --out FILE ...`
    exporter.write_text('#!/bin/sh\nwhile [ "$1" != --out ]; do shift; done\nhead -c 40000000 /dev/zero > "$2"\n')
    exporter.chmod(0o755)
    best = tmp_path / "out" / "runs" / "worlds-dgpo-all-24l+lr5e5" / "checkpoints" / "best"
    best.mkdir(parents=True)
    done = subprocess.run(["bash", str(tmp_path / "bench" / "factbook_rows.sh"), "pack", str(best)],
                          env={**os.environ, "PYTHON": str(exporter), "KD_ADAPTER": str(adapter)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    name = "worlds-dgpo-all-24l_lr5e5-best"
    assert sorted(p.name for p in (tmp_path / "out" / "pack").iterdir()) == [
        f"{name}.q8_0.gguf.part00", f"{name}.q8_0.gguf.part01", f"{name}.q8_0.gguf.part02", f"{name}.q8_0.gguf.sha256"]
    listed = bring(tmp_path, name)
    assert listed.returncode == 0 and "call 1 of 1" in listed.stdout
