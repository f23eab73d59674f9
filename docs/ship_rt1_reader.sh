#!/usr/bin/env bash
# The state reader both shipped RT-1 world models decide success with, and rt1-mle's refiner fine-tuned on its own
# 5-frame rollouts (a quarter of each batch). Then both are recalibrated. On the 2-core CPU: the refiner 10 minutes
# rolling out and 8 training (one process), the reader 15 (two processes, one thread each), each calibration 6.
# Needs the shipped models' data (`rlvr-gym collect rt1 --out runs/rt1/train2 --episodes 800 --seed 1 --workers 2`
# and `... --out runs/rt1/heldout2 --episodes 60 --seed 2 --split heldout`). A killed run continues with the same
# command plus --resume (extra arguments go to both training runs). The refiner run starts from rt1-mle as it was
# before this script ran (commit 7d21c81, whose refiner also drew the rollouts); point BASE at that checkpoint:
#   git worktree add /tmp/base 7d21c81 && BASE=/tmp/base/rlvr_gym/checkpoints/rt1-mle bash docs/ship_rt1_reader.sh
#
#   bash docs/ship_rt1_reader.sh
set -eu
PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-runs/rt1}
BASE=${BASE:-rlvr_gym/checkpoints/rt1-mle}
export HF_HUB_OFFLINE=1
# rt1-mle's refiner, 800 more steps: a quarter of each batch from frames 2..5 of 2,048 greedy 5-frame rollouts (each
# refined from the two frames the rollout showed before it), 0.375 where a whole object moves, 0.25 where one comes
# out from under the gripper.
$PY -m rlvr_gym train refiner --world-model "$BASE" --model "$BASE/motion_refiner" \
    --run-dir "$RUNS/refiner_mle_rollouts" --data runs/rt1/train2 --heldout runs/rt1/heldout2 --prediction-episodes 0 \
    --steps 800 --lr 2e-4 --warmup-steps 20 --batch-size 16 --moved-fraction 0.375 --revealed-fraction 0.25 \
    --rollout-depth 5 --rollout-starts 2048 --rollout-fraction 0.25 "$@"
# The reader: 4,000 steps of 32 frames on each process, half of them through the (shared) frame tokenizer first.
$PY -m torch.distributed.run --standalone --nproc-per-node 2 -m rlvr_gym train state-reader --world-model rt1-mle \
    --data runs/rt1/train2 --heldout runs/rt1/heldout2 --run-dir "$RUNS/reader" --steps 4000 --recon-fraction 0.5 \
    --eval-every 1000 --save-every 500 "$@"
$PY - "$RUNS/refiner_mle_rollouts/final" "$RUNS/reader/final" <<'PYTHON'
import json
import sys
import torch
from rlvr_gym.models.lm import SHIPPED_DIR
from rlvr_gym.models.robot_world_model import load_motion_refiner, load_state_reader
load_motion_refiner(sys.argv[1]).to(torch.float16).save_pretrained(SHIPPED_DIR / "rt1-mle" / "motion_refiner")
for name in ("rt1-mle", "rt1-rlvr"):
    load_state_reader(sys.argv[2]).to(torch.float16).save_pretrained(SHIPPED_DIR / name / "state_reader")
    meta = SHIPPED_DIR / name / "world_model.json"
    settings = json.loads(meta.read_text())
    settings["settings"]["success_thresholds"] = {}  # the flag's thresholds mean nothing to the reader
    meta.write_text(json.dumps(settings, indent=2))
    print("wrote", SHIPPED_DIR / name / "state_reader")
PYTHON
for name in rt1-mle rt1-rlvr; do
    $PY -m rlvr_gym calibrate rt1 --checkpoint "rlvr_gym/checkpoints/$name" --data runs/rt1/train2 --episodes-per-task 64
done
