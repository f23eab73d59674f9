#!/usr/bin/env bash
# The motion refiner of the shipped rt1-mle and rt1-rlvr (session 17): trained on rt1-rlvr's own greedy
# predictions of the 800 training episodes (and the real codes) against the real next frames, then copied in fp16
# into both shipped checkpoints, whose transformers and tokenizer stay as they were. On the 2-core CPU: 6 minutes
# predicting the 24,930 transitions, 18 minutes training (two processes, one thread each). Needs the shipped models'
# data (`rlvr-gym collect rt1 --out runs/rt1/train2 --episodes 800 --seed 1 --workers 2` and `... --out
# runs/rt1/heldout2 --episodes 60 --seed 2 --split heldout`). A killed run continues with the same command plus
# --resume.
#
#   bash docs/ship_rt1_refiner.sh
set -eu
PY=${PY:-.venv/bin/python}
RUN=${RUN:-runs/rt1/refiner}
export HF_HUB_OFFLINE=1
$PY -m torch.distributed.run --standalone --nproc-per-node 2 -m rlvr_gym train refiner --world-model rt1-rlvr \
    --data runs/rt1/train2 --heldout runs/rt1/heldout2 --run-dir "$RUN" --prediction-episodes 0 --moved-fraction 0.5 \
    --width 24 --bottleneck-blocks 1 --batch-size 16 --steps 2400 --lr 5e-4 --save-every 100 --eval-every 800 \
    --eval-transitions 256 "$@"
$PY - "$RUN/final" <<'PYTHON'
import sys
import torch
from rlvr_gym.models.lm import SHIPPED_DIR
from rlvr_gym.models.robot_world_model import load_motion_refiner
refiner = load_motion_refiner(sys.argv[1]).to(torch.float16)
for name in ("rt1-mle", "rt1-rlvr"):
    refiner.save_pretrained(SHIPPED_DIR / name / "motion_refiner", safe_serialization=True)
    print("wrote", SHIPPED_DIR / name / "motion_refiner")
PYTHON
