#!/usr/bin/env bash
# On the GPU machine, the lease's first call (carry [.carry/whl, .carry/qwen2]; bench/lease/prepare.sh
# made them), and `setup.sh data` a second one that carries [.carry/data] (prepare.sh WORLDS=1):
# the missing wheels and this checkout installed into the image's Python, FactbookQA built, the
# paper-shape random checkpoints of bench/rl_cost.py started in the background (out/logs/rlcost-prepare.log;
# RL_COST=0 skips them, for a lease that runs no bench/rl_cost.py and wants its CPUs for training).
# The checkout is installed editable: `python3 -m dgpo_edge` from the root then finds dgpo_edge.train,
# which lives in train/ (pyproject's package-dir), where the source folder alone would not.
# (Links made on the machine do not help: every call copies the checkout again and removes what it lacks.)
# The NCCL/NVSHMEM multicast switches below hold for this script's children only: export them again
# in every call that starts a job on several GPUs.
set -euo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unpack() {  # data built here beforehand (prepare.sh WORLDS=1), into the checkout's root
  for t in .carry/data/*.tgz; do
    if [ -f "$t" ]; then tar xzf "$t"; echo "unpacked $t"; fi
  done
}
if [[ ${1:-} == data ]]; then   # a call of its own: with the checkout, wheels + tokenizer + data pass 64 MiB
  compgen -G ".carry/data/*.tgz" > /dev/null || { echo "error: carry .carry/data with this call" >&2; exit 2; }
  unpack; exit 0
fi
compgen -G ".carry/whl/*.whl" > /dev/null || { echo "error: carry .carry/whl with this call (bench/lease/prepare.sh)" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile .carry/whl/*.whl
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip-self.log 2>&1 || { tail -20 /tmp/pip-self.log; exit 1; }
python3 -c "import dgpo_edge.train.rl.loop, dgpo_edge.export" || { echo "error: dgpo_edge.train does not import" >&2; exit 1; }
mkdir -p device out/logs && rm -rf device/qwen2 && cp -r .carry/qwen2 device/qwen2
unpack   # when this call carries .carry/data too
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
[ -f out/factbookqa/train.jsonl ] || python3 -m dgpo_edge data factbook --out out/factbookqa > out/logs/data.log 2>&1 \
  || { tail out/logs/data.log; exit 1; }
[ "${RL_COST:-1}" = 0 ] || setsid nohup python3 bench/rl_cost.py prepare --tokenizer device/qwen2 > out/logs/rlcost-prepare.log 2>&1 < /dev/null &
echo "set up"
