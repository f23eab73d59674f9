#!/usr/bin/env bash
# The longer recipe for the text-game and web world models (textgame-sft / textgame-rlvr, web-sft / web-rlvr) in
# one go: SFT from scratch, GRPO with two learning rates per reward, and the evaluations that choose and report them.
# Every stage is an ordinary `rlvr-gym` command with a time limit (--*.max-minutes), so the same script runs on one
# GPU (the default 2.5 minutes per stage) or on a CPU (set MINUTES higher; expect far fewer steps). The shipped
# checkpoints were made on this project's 2-core CPU with the shorter commands in their CARD.md; this script was
# checked end to end on that CPU with tiny limits, and has not yet run on a GPU.
#
#   TEXT_DATA=../shared/data/bytesized32 TEXTWORLD=runs/textworld WEB=runs/web OUT=runs/ship bash docs/ship_text_web.sh
#
# Inputs: ByteSized32 train/valid (TEXT_DATA), `rlvr-gym collect textworld` train/ and heldout/ (TEXTWORLD),
# `rlvr-gym collect web` train2/ (--seed 0), train3/ (--seed 3) and heldout2/ (WEB). Output: OUT/*.tar (each model
# in fp16, logs, eval lines).
set -u
PY=${PY:-python3}
RUNS=${RUNS:-runs/ship}
OUT=${OUT:-runs/ship/out}
TEXT_DATA=${TEXT_DATA:-../shared/data/bytesized32}
TEXTWORLD=${TEXTWORLD:-runs/textworld}
WEB=${WEB:-runs/web}
MINUTES=${MINUTES:-2.5}        # per training stage
EVAL_LIMIT=${EVAL_LIMIT:-0}    # 0: the whole file
mkdir -p "$RUNS" "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
TEXT=(--data "$TEXT_DATA/train.jsonl.gz" --eval-data "$TEXT_DATA/valid.jsonl.gz" --textworld "$TEXTWORLD/train")
STAMP() { echo "[$(date +%T)] $*"; }

text_sft() {
  $PY -m rlvr_gym train textgame-sft --run-dir "$RUNS/textgame-sft" "${TEXT[@]}" \
    --sft.steps 3000 --sft.batch-size 64 --sft.micro-batch 64 --sft.lr 1e-3 --sft.warmup-steps 100 \
    --sft.save-every 500 --sft.eval-every 1000 --sft.max-minutes "$MINUTES" > "$RUNS/textgame-sft.log" 2>&1
}

text_rlvr() {  # reward lr
  $PY -m rlvr_gym train textgame-rlvr --run-dir "$RUNS/textgame-rlvr-$1-$2" --model "$RUNS/textgame-sft/final" \
    --reward "$1" "${TEXT[@]}" --grpo.steps 2000 --grpo.lr "$2" --grpo.prompts-per-step 32 --grpo.group-size 8 \
    --grpo.micro-batch 64 --grpo.max-new-tokens 256 --grpo.save-every 50 --grpo.eval-every 50 \
    --grpo.max-minutes "$MINUTES" > "$RUNS/textgame-rlvr-$1-$2.log" 2>&1
}

web_sft() {
  $PY -m rlvr_gym train web-sft --run-dir "$RUNS/web-sft" --data "$WEB/train2" "$WEB/train3" --eval-data "$WEB/heldout2" \
    --sft.steps 6000 --sft.batch-size 64 --sft.micro-batch 32 --sft.lr 1e-3 --sft.warmup-steps 100 \
    --sft.save-every 500 --sft.eval-every 1000 --sft.max-minutes "$MINUTES" > "$RUNS/web-sft.log" 2>&1
}

web_rlvr() {  # lr
  $PY -m rlvr_gym train web-rlvr --run-dir "$RUNS/web-rlvr-$1" --model "$RUNS/web-sft/final" \
    --data "$WEB/train2" "$WEB/train3" --eval-data "$WEB/heldout2" --grpo.steps 2000 --grpo.lr "$1" \
    --grpo.prompts-per-step 32 --grpo.group-size 8 --grpo.micro-batch 32 --grpo.max-new-tokens 768 --grpo.save-every 50 --grpo.eval-every 50 \
    --grpo.max-minutes "$MINUTES" > "$RUNS/web-rlvr-$1.log" 2>&1
}

text_eval() {  # name checkpoint [best_of]
  for data in valid textworld; do
    file="$TEXT_DATA/valid.jsonl.gz"; [ "$data" = textworld ] && file="$TEXTWORLD/heldout/transitions.jsonl.gz"
    $PY -m rlvr_gym eval textgame --data "$file" --checkpoint "$2" --limit "$EVAL_LIMIT" --batch-size 64 \
      --best-of "${3:-1}" > "$RUNS/eval-$1-$data.line" 2> "$RUNS/eval-$1-$data.err"
  done
}

stage() { [[ " ${STAGES:-sft rlvr eval pack} " == *" $1 "* ]] && STAMP "$1"; }

if stage sft; then text_sft & web_sft & wait; fi
if stage rlvr; then
  for lr in 3e-5 1e-4; do text_rlvr binary $lr & text_rlvr task $lr & web_rlvr $lr & done
  wait
fi
if stage eval; then
  text_eval sft "$RUNS/textgame-sft/final" &
  for r in binary task; do for lr in 3e-5 1e-4; do text_eval "rlvr-$r-$lr" "$RUNS/textgame-rlvr-$r-$lr/final" & done; done
  for n in 4 16; do text_eval "sft-best$n" "$RUNS/textgame-sft/final" $n & done
  wait
fi
if stage pack; then
  for run in "$RUNS"/*/; do
    name=$(basename "$run")
    [ -d "$run/final" ] && $PY -c "from rlvr_gym.models.lm import ship_lm; ship_lm('$run/final', '$RUNS/ship/$name')"
  done
  (cd "$RUNS" && tar cf "$OUT/logs.tar" --exclude='*.safetensors' --exclude='*.pt' --exclude=./ship --exclude=./out \
    --exclude=tb .)
  (cd "$RUNS/ship" && tar cf "$OUT/textgame-sft.tar" textgame-sft && tar cf "$OUT/web-sft.tar" web-sft \
    && tar cf "$OUT/textgame-rlvr-binary.tar" textgame-rlvr-binary-* \
    && tar cf "$OUT/textgame-rlvr-task.tar" textgame-rlvr-task-* && tar cf "$OUT/web-rlvr.tar" web-rlvr-*)
  ls -la "$OUT"
fi
cat "$RUNS"/eval-*.line
tail -n 2 "$RUNS"/*.log "$RUNS"/*.err | cut -c1-300
STAMP "done"
