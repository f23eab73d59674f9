"""Run under torchrun by test_training.py: a short GRPO run whose reward records what each rank saw."""

import json
import os
import sys
from pathlib import Path

import torch

from rlvr_gym.train.demo import char_tokenizer, make_examples, sorted_digits_reward
from rlvr_gym.train.grpo import GRPOConfig, train_grpo

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
torch.distributed.destroy_process_group()
