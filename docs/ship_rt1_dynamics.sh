#!/usr/bin/env bash
# rt1-dynamics: rt1-rlvr's video model with state dynamics beside it, from which its simulator decides success (the
# task's own test on the predicted state). On the 2-core CPU: the data about 1 minute, the dynamics 5 (two
# processes, one thread each). A killed run continues with the same command plus --resume.
#
#   bash docs/ship_rt1_dynamics.sh
set -eu
PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-runs/rt1}
export HF_HUB_OFFLINE=1
R="$PY -m rlvr_gym"
# Real tabletop episodes: rt1-rlvr's training set (its 64 initial states start 64 of them, which the training leaves
# out), 512 more of the scripted policies, 256 of the probe's trivial policies, and the held-out set.
[ -d runs/rt1/train2 ] || $R collect rt1 --out runs/rt1/train2 --episodes 800 --seed 1 --workers 2
[ -d runs/rt1/train21 ] || $R collect rt1 --out runs/rt1/train21 --episodes 512 --seed 21 --workers 2
[ -d runs/rt1/trivial11 ] || $R collect rt1 --out runs/rt1/trivial11 --episodes 256 --seed 11 --random-fraction 0.0625 \
    --trivial-fraction 0.9375 --workers 2
[ -d runs/rt1/heldout2 ] || $R collect rt1 --out runs/rt1/heldout2 --episodes 60 --seed 2 --split heldout
# 5,000 steps, 5 members of 3 x 256, 512 transitions per member per process.
$PY -m torch.distributed.run --standalone --nproc-per-node 2 -m rlvr_gym train state-dynamics --world-model rt1-rlvr \
    --data runs/rt1/train2 runs/rt1/train21 runs/rt1/trivial11 --heldout runs/rt1/heldout2 \
    --run-dir "$RUNS/dynamics" "$@"
$PY - "$RUNS/dynamics/world_model" <<'PYTHON'
import sys
from rlvr_gym.models.lm import SHIPPED_DIR
from rlvr_gym.models.robot_world_model import RobotWorldModel
card = SHIPPED_DIR / "rt1-dynamics" / "CARD.md"
RobotWorldModel.load(sys.argv[1]).ship(sys.argv[1], "rt1-dynamics", card.read_text() if card.is_file() else "")
PYTHON
