#!/usr/bin/env bash
# Refit the shipped text simulator on trained agents' real play: the states agents drive it into, which its own
# training data (scripted walkthroughs and random play in other games) does not cover. textgame-rlvr pays six such
# agents 0.19 where they win 0.50 (`python -m bench.text_agents_paid`).
#
#   bash docs/refit_text.sh                                                       # the README's refit rows
#   WIN_SHARE=0 GRPO_WIN_SHARE=0 SFT_STEPS=300 OUT=runs/refit2 bash docs/refit_text.sh   # the row without repetition
#   RANDOM_EPISODES=4 SCORE=rlvr OUT=runs/refit3 bash docs/refit_text.sh        # the row with random play added
#   SFT_STEPS=0 GRPO_FROM=runs/refit/rlvr/final GRPO_DATA=runs/refit4/random/transitions.jsonl.gz SURPRISE=0.5 \
#     GRPO_WIN_SHARE=0 RANDOM_EPISODES=4 SCORE=rlvr OUT=runs/refit4 bash docs/refit_text.sh
#                                                   # the row with GRPO on the random steps the first refit gets wrong
#
# Inputs: the agents `python -m bench.sim_to_real --tasks text ... --arms loop loop-mle real-1x` kept for seeds 0 and
# 1 (README, the bold text setting; SEEDS to choose others) and the world model's own TextWorld data
# (`rlvr-gym collect textworld --games 150 --out runs/textworld/train`). The agents of the other seeds are the held-out
# ones the last step scores it with. About 50 minutes on the project's 2-core CPU.
set -eu
PY=${PY:-.venv/bin/python}
TORCHRUN=${TORCHRUN:-$(dirname "$PY")/torchrun}
OUT=${OUT:-runs/refit}
SEEDS=${SEEDS:-0 1}
HELD_OUT=${HELD_OUT:-2 3}
WIN_SHARE=${WIN_SHARE:-0.2}
GRPO_WIN_SHARE=${GRPO_WIN_SHARE:-0.3}
SFT_STEPS=${SFT_STEPS:-400}
RANDOM_EPISODES=${RANDOM_EPISODES:-0}
SCORE=${SCORE:-$([ "$SFT_STEPS" -gt 0 ] && echo "sft rlvr" || echo rlvr)}  # the stages scored as shipped simulators
GRPO_FROM=${GRPO_FROM:-$OUT/sft/final}  # with SFT_STEPS=0, GRPO alone on another model
GRPO_DATA=${GRPO_DATA:-$OUT/playonly/transitions.jsonl.gz}
SURPRISE=${SURPRISE:-0}  # share of GRPO prompts from steps whose outcome (score, game end, win) the model gets wrong
GRPO_STEPS=${GRPO_STEPS:-40}
BOLD=${BOLD:-runs/bench/sim_to_real/text+real-updates+win0.2+surprise-outcome+replay+pretrain4096+score-data}
REAL=${REAL:-runs/bench/sim_to_real/text}
export HF_HUB_OFFLINE=1
mkdir -p "$OUT/mix" "$OUT/playonly"

agents() {  # a seed's agents: the real-env DQN's scored ones, the loop's pretrained and round ones, MLE-only rounds'
  local s=$1 real loop mle
  real=$(ls -d "$REAL"/real-1x-"$s"-*steps-score-data.agents | head -1)
  loop=$(ls -d "$BOLD"/loop-"$s"-* | head -1)
  mle=$(ls -d "$BOLD"/loop-mle-"$s"-* | head -1)
  echo "$real"/point*.zip "$loop"/pretrain/agent.zip "$loop"/round_*/agent.zip "$mle"/round_*/agent.zip
}

plays=()
if [ "$RANDOM_EPISODES" -gt 0 ]; then
  # Uniformly random commands in the same games: the real outcomes of the play an exploiting agent starts from.
  # Other seeds than the probe's.
  $PY -m rlvr_gym collect text-agents --agents random --episodes-per-game "$RANDOM_EPISODES" --seed 100 \
    --out "$OUT/random"
  plays+=("$OUT/random/transitions.jsonl.gz")
fi
for s in $SEEDS; do
  # shellcheck disable=SC2046
  $PY -m rlvr_gym collect text-agents --agents $(agents "$s") --out "$OUT/play-seed$s" --seed "$s"
  plays+=("$OUT/play-seed$s/transitions.jsonl.gz")
done
cat "${plays[@]}" > "$OUT/playonly/transitions.jsonl.gz"
cat runs/textworld/train/transitions.jsonl.gz "${plays[@]}" > "$OUT/mix/transitions.jsonl.gz"

if [ "$SFT_STEPS" -gt 0 ]; then
  "$TORCHRUN" --standalone --nproc-per-node 2 -m rlvr_gym train textgame-sft --run-dir "$OUT/sft" \
    --model rlvr_gym/checkpoints/textgame-rlvr --textworld "$OUT/mix" --win-share "$WIN_SHARE" \
    --eval-accuracy-examples 0 --eval-data "" --sft.steps "$SFT_STEPS" --sft.lr 2e-4 --sft.warmup-steps 10 \
    --sft.batch-size 16 --sft.micro-batch 2 --sft.save-every 50 --sft.threads 1
fi
"$TORCHRUN" --standalone --nproc-per-node 2 -m rlvr_gym train textgame-rlvr --run-dir "$OUT/rlvr" \
  --model "$GRPO_FROM" --data "$GRPO_DATA" --win-share "$GRPO_WIN_SHARE" --surprise-prompts "$SURPRISE" \
  --surprise-on outcome --reward binary --eval-accuracy-examples 0 --eval-data "" --grpo.steps "$GRPO_STEPS" \
  --grpo.lr 5e-5 \
  --grpo.prompts-per-step 4 --grpo.group-size 8 --grpo.max-new-tokens 128 --grpo.temperature 0.7 --grpo.beta 0 \
  --grpo.micro-batch 8 --grpo.save-every 5 --grpo.eval-every 0 --grpo.threads 1 --grpo.dynamic-sampling \
  --grpo.max-draws 8
for stage in rlvr $([ "$SFT_STEPS" -gt 0 ] && echo sft); do
  $PY -m rlvr_gym ship --src "$OUT/$stage/final" --name "textgame-refit-$stage" --domain textgame \
    --out "$OUT/ship-$stage"
done

# Scored as a shipped simulator: the policy ladder, the exploit probe on every game, and what it pays agents of
# the held-out seeds against textgame-rlvr.
held_out=()
for s in $HELD_OUT; do
  real=$(ls -d "$REAL"/real-1x-"$s"-*steps-score-data.agents | head -1)
  held_out+=("$real/point2.zip" "$(ls -d "$BOLD"/loop-"$s"-* | head -1)/round_02/agent.zip"
             "$(ls -d "$BOLD"/loop-mle-"$s"-* | head -1)/round_02/agent.zip")
done
for stage in $SCORE; do
  $PY -m rlvr_gym evaluate-policies textgame --checkpoint "$OUT/ship-$stage" --episodes 32 > "$OUT/pe-$stage.json"
  $PY -m rlvr_gym probe textgame --checkpoint "$OUT/ship-$stage" --starts 32 --out "$OUT/probe-$stage"
done
# shellcheck disable=SC2046
$PY -m bench.text_agents_paid --checkpoints textgame-rlvr $(for stage in $SCORE; do echo "$OUT/ship-$stage"; done) \
  --agents "${held_out[@]}"
