"""Run under torchrun by test_training.py: a short GRPO run whose reward records what each rank saw, then a scan
shared out across the ranks."""

import json
import os
import sys
from pathlib import Path

import torch

from rlvr_gym.train.demo import char_tokenizer, make_examples, sorted_digits_reward
from rlvr_gym.train.grpo import GRPOConfig, train_grpo
from rlvr_gym.train.run import map_across_ranks, setup_processes

init_model, out = sys.argv[1], Path(sys.argv[2])
rank = int(os.environ["RANK"])
seen = []


def recording_reward(completions, answer, prompts, **kw):
    results = sorted_digits_reward(completions, answer)
    seen.append({"prompts": sorted(set(prompts)), "reward": sum(r["score"] for r in results) / len(results)})
    return results


examples = make_examples(200, 0, 3, 4, char_tokenizer())
config = GRPOConfig(run_dir=str(out / "run"), model=init_model, steps=3, prompts_per_step=4, group_size=4,
                    max_new_tokens=6, lr=1e-2, beta=0.01, save_every=2)
train_grpo(config, recording_reward, examples)
(out / f"rank{rank}.json").write_text(json.dumps(seen))
scanned = []


def scan(part):
    scanned.extend(part)
    return [(x, rank) for x in part]


results = map_across_ranks(setup_processes(1), list(range(7)), scan)
(out / f"scan{rank}.json").write_text(json.dumps({"scanned": scanned, "results": results}))
torch.distributed.destroy_process_group()
