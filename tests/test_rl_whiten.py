"""ppo.whiten and critic.value_mask: the reference's masks, whitening and GAE against hand-computed values.

The episode used throughout (one row, 7 positions):

    position     0       1       2    3    4     5    6
    kind         prompt  prompt  gen  gen  obs   gen  pad
    mask         0       0       1    1    0     1    0
    attention    1       1       1    1    1     1    0
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from dgpo_edge.train.rl.math import (
    gae,
    masked_whiten,
    response_mask,
    shifted_response_mask,
    token_rewards,
    value_loss,
    value_mask,
    whiten_advantages,
)


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def close(actual, expected, tol=1e-5):
    torch.testing.assert_close(actual, t(expected), rtol=0, atol=tol)


MASK = t([[0, 0, 1, 1, 0, 1, 0]])
ATTN = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])


def test_response_masks_cover_observations_and_the_terminal_position():
    mask = t([[0, 0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1]])
    attn = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    close(response_mask(attn, mask), [[0, 0, 1, 1, 1, 1, 0], [0] * 7, [0, 0, 0, 0, 1, 1, 1]])
    # one past the last real token (position 6) joins; a row filling the width has no room for it
    close(shifted_response_mask(attn, mask), [[0, 0, 1, 1, 1, 1, 1], [0] * 7, [0, 0, 0, 0, 1, 1, 1]])
    close(value_mask(attn, mask, "generated"), mask.tolist())
    with pytest.raises(ValueError):
        value_mask(attn, mask, "tokens")


def test_unbiased_whitening_by_hand():
    # mean 2, unbiased variance (1 + 0 + 1) / 2 = 1 -> the centred values themselves
    close(masked_whiten(t([[1.0, 2.0, 3.0, 100.0]]), t([[1, 1, 1, 0]]), unbiased=True), [[-1.0, 0.0, 1.0, 0.0]])
    # a single entry: variance 0 either way, not a division by zero
    close(masked_whiten(t([[5.0, 7.0]]), t([[0, 1]]), unbiased=True), [[0.0, 0.0]])


def test_whiten_advantages_reference_and_generated_by_hand():
    adv = t([[0.0, 0.0, 1.0, 2.0, 4.0, 5.0, 0.0]])
    # generated: over 1, 2, 5 -> mean 8/3, biased variance 26/9, std 1.699673
    close(whiten_advantages(adv, MASK, ATTN, "generated"), [[0, 0, -0.980581, -0.392232, 0, 1.372813, 0]])
    # reference: over 1, 2, 4, 5 (the observation too) -> mean 3, unbiased variance 10/3, std 1.825742
    close(whiten_advantages(adv, MASK, ATTN, "reference"), [[0, 0, -1.095445, -0.547723, 0.547723, 1.095445, 0]])
    close(whiten_advantages(adv, MASK, ATTN, "none"), adv.tolist())
    with pytest.raises(ValueError):
        whiten_advantages(adv, MASK, ATTN, "global")


VALUES = t([[9.0, 9.0, 0.5, 0.4, 0.3, 0.8, 0.2]])   # 9 on the prompt: never read


def test_gae_over_the_reference_states_bootstraps_the_terminal_value():
    rewards = token_rewards(t([1.0]), MASK)          # the score on position 5, the last generated token
    steps = value_mask(ATTN, MASK, "reference")
    adv, ret = gae(rewards, VALUES, steps, gamma=1.0, lam=0.5)
    # delta_6 = -0.2; delta_5 = 1 + 0.2 - 0.8 = 0.4; delta_4 = 0.8 - 0.3; delta_3 = 0.3 - 0.4; delta_2 = 0.4 - 0.5
    close(adv, [[0, 0, 0.0125, 0.225, 0.65, 0.3, -0.2]])
    close(ret, [[0, 0, 0.5125, 0.625, 0.95, 1.1, 0.0]])   # the terminal state's target is 0
    # generated tokens only: the observation and the terminal state are skipped
    adv, ret = gae(rewards, VALUES, value_mask(ATTN, MASK, "generated"), gamma=1.0, lam=0.5)
    # delta_5 = 1 - 0.8 = A_5; delta_3 = 0.8 - 0.4, A_3 = 0.4 + 0.5 * 0.2; delta_2 = 0.4 - 0.5, A_2 = -0.1 + 0.25
    close(adv, [[0, 0, 0.15, 0.5, 0, 0.2, 0]])


def test_value_loss_on_the_reference_mask_and_on_generated_tokens():
    rewards = token_rewards(t([1.0]), MASK)
    for mode, expected in (("reference", 0.5 * (0.25 + 0.36 + 0.49 + 0.04 + 0.04) / 5),
                           ("generated", 0.5 * (0.25 + 0.36 + 0.04) / 3)):
        steps = value_mask(ATTN, MASK, mode)
        _, ret = gae(rewards, VALUES, steps)           # gamma = lambda = 1: returns 1, 1, (1), 1, (0)
        loss, _ = value_loss(VALUES, VALUES, ret, steps)
        assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_reduce_gives_the_statistics_of_the_concatenated_batch():
    x = t([[1.0, 2.0, 7.0, 0.0], [3.0, -1.0, 0.0, 4.0]])
    mask = t([[1, 1, 1, 0], [1, 1, 0, 1]])
    # two processes holding the same rows: an all-reduce doubles every sum
    twice = masked_whiten(x, mask, unbiased=True, reduce=lambda v: 2 * v)
    whole = masked_whiten(torch.cat([x, x]), torch.cat([mask, mask]), unbiased=True)
    close(twice, whole[:2].tolist())
    assert not torch.allclose(twice, masked_whiten(x, mask, unbiased=True))


_WORKER = r"""
import json, os, sys, torch, torch.distributed as dist
from dgpo_edge.train.rl.math import whiten_advantages
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=rank, world_size=2)
data = json.loads(sys.argv[3])[rank]
def reduce(v):
    dist.all_reduce(v)
    return v
out = whiten_advantages(torch.tensor(data["adv"]), torch.tensor(data["mask"]), torch.tensor(data["attn"]),
                        "reference", reduce)
print(json.dumps(out.tolist()))
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_processes_whiten_like_the_concatenated_batch():
    shards = [{"adv": [[0.0, 0.0, 1.0, 2.0, 4.0, 5.0, 0.0]], "mask": MASK.tolist(), "attn": ATTN.tolist()},
              {"adv": [[0.0, 3.0, -2.0, 0.5, 9.0, 0.0, 0.0]], "mask": [[0, 1, 1, 0, 1, 0, 0]],
               "attn": [[1, 1, 1, 1, 1, 1, 1]]}]
    port = str(_free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(r), port, json.dumps(shards)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for r in (0, 1)]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    whole = whiten_advantages(torch.tensor([s["adv"][0] for s in shards]),
                              torch.tensor([s["mask"][0] for s in shards]),
                              torch.tensor([s["attn"][0] for s in shards]), "reference")
    close(torch.tensor([outs[0][0], outs[1][0]]), whole.tolist())
    # and not what each process would get on its own
    alone = whiten_advantages(torch.tensor(shards[0]["adv"]), MASK, ATTN, "reference")
    assert not torch.allclose(torch.tensor(outs[0]), alone)
