"""A student folder the bundle can serve (student.json + adapter/, docs/bundles.md) from a KD or RL run's adapter,
e.g. one a lease brought back (bench/lease/watch.sh: worlds-kd-all-24l-adapter.tgz).

    python bench/ship_student.py out/pack/worlds-kd-all-24l-adapter --name worlds-kd-24l-lora-r32 \
        --trained trained.json --out out/student-24l
    DGPO_EDGE_STUDENT=out/student-24l dgpo-edge eval --data out/factbookqa/test.jsonl --threads 1 ...
    rm -r dgpo_edge/bundle/shipped && cp -r out/student-24l dgpo_edge/bundle/shipped      # to ship it

The student's depth is the adapter's (its highest layer index + 1), and its layers are the ones
`dgpo-edge model prune --keep-layers N` kept when it was trained (evenly spaced, first and last kept).
The base GGUF, the quant, the retriever and the protocol limits are copied from another student.json
(--like; default: the shipped one): a student is trained on the same base, and the base's depth is that
student's last kept layer + 1. `trained` (recipe, card, commit, date, GPU EM) is --trained, a JSON object
written from the lease's evaluation rows. The folder is written beside --out and renamed onto it only
when complete; a bad adapter is one `error:` line and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from dgpo_edge.bundle.student import SHIPPED, read_adapter, shipped_student
from dgpo_edge.errors import InputError
from dgpo_edge.jsonio import atomic_dir, file_digest
from dgpo_edge.train.models import evenly_spaced_layers

FILES = ("adapter_config.json", "adapter_model.safetensors", "norms.safetensors")   # the last one optional


def adapter_depth(adapter: Path) -> int:
    """Layers the adapter covers: 0..N-1, each of them (a gap means it was not made by pruning)."""
    deltas, _, _ = read_adapter(adapter)
    layers = sorted({layer for layer, _ in deltas})
    if not layers or layers != list(range(len(layers))):
        raise InputError(f"the adapter's layers are not 0..N-1 (got {layers[:3]}…{layers[-3:]})",
                         adapter / "adapter_model.safetensors")
    return len(layers)


def student_spec(adapter: Path, like: dict, name: str, trained: dict) -> dict:
    depth = adapter_depth(adapter)
    base_layers = max(like["layers"]) + 1
    if depth > base_layers:
        raise InputError(f"the adapter has {depth} layers, the base only {base_layers}", adapter)
    digests = {f: file_digest(adapter / f)["sha256"] for f in FILES if (adapter / f).is_file()}
    keep = ("base", "quant", "index_kind", "protocol")
    return {"name": name, **{k: like[k] for k in keep}, "layers": evenly_spaced_layers(base_layers, depth),
            "adapter": digests, "trained": trained}


def ship(args: argparse.Namespace) -> Path:
    like = shipped_student(args.like)
    if like is None:
        raise InputError("no student.json to copy the base and limits from (--like)", args.like)
    trained = json.loads(args.trained.read_text(encoding="utf-8"))
    if not isinstance(trained, dict):
        raise InputError("--trained must hold a JSON object (recipe, card, commit, date, gpu_em)", args.trained)
    spec = student_spec(args.adapter, like.spec, args.name, trained)
    # an existing student folder (student.json) is replaced; any other non-empty folder is refused
    with atomic_dir(args.out, lambda d: (d / "student.json").is_file(), "a student folder") as tmp:
        (tmp / "adapter").mkdir()
        for f in spec["adapter"]:
            shutil.copyfile(args.adapter / f, tmp / "adapter" / f)
        (tmp / "student.json").write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
        shipped_student(tmp)            # the bundle's own reader accepts it
    return args.out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("adapter", type=Path, help="a KD or RL run's adapter folder (checkpoints/best/adapter)")
    ap.add_argument("--name", required=True, help="the student's name (in the bundle and the GGUF's file name)")
    ap.add_argument("--trained", type=Path, required=True, help="JSON object: recipe, card, commit, date, gpu_em")
    ap.add_argument("--out", type=Path, required=True, help="the student folder to write")
    ap.add_argument("--like", type=Path, default=SHIPPED, help="a student folder whose base and limits to copy")
    args = ap.parse_args()
    try:
        out = ship(args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    spec = json.loads((out / "student.json").read_text())
    print(f"wrote {out}: {spec['name']}, {len(spec['layers'])} layers {spec['layers']}")


if __name__ == "__main__":
    main()
