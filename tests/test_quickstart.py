"""The main job: its helpers (fast) and one small end-to-end run on the shipped checkpoints (slow)."""

import json
import math

import pytest
import tyro

from rlvr_gym.quickstart import (
    QuickstartConfig,
    Section,
    last_json_line,
    ppo_command,
    run_quickstart,
    summary_markdown,
)
from rlvr_gym.train.demo import DemoConfig
from rlvr_gym.train.grpo import GRPOConfig
from rlvr_gym.train.sft import SFTConfig


def test_the_ppo_command_is_one_the_agent_trainer_accepts(tmp_path):
    from agents.train_sb3 import Args

    config = QuickstartConfig(ppo_steps=640, ppo_eval_every=320, ppo_envs=8, ppo_task="open_drawer",
                              ppo_checkpoint="rt1-mle", ppo_shaping=0.1, ppo_eval_first=100, ppo_eval_episodes=3)
    command = ppo_command(config, tmp_path / "ppo")
    assert command[1:3] == ["-m", "agents.train_sb3"]
    args = tyro.cli(Args, args=command[3:])
    assert (args.algo, args.steps, args.num_envs, args.task, args.checkpoint) == ("ppo", 640, 8, "open_drawer", "rt1-mle")
    assert (args.shaping, args.eval_every, args.eval_episodes, args.eval_first, args.eval_learned, args.out) == (
        0.1, 320, 3, 100, True, str(tmp_path / "ppo"))


def test_the_result_line_is_read_after_other_output():
    assert last_json_line('step 1\n{"a": 1}\n{"steps": 64, "real": {"success_rate": 0.5}}\n\n') == {
        "steps": 64, "real": {"success_rate": 0.5}}
    with pytest.raises(ValueError, match="printed nothing"):
        last_json_line("\n  \n")


def test_the_summary_lists_every_section_with_its_time():
    sections = [Section("1. first", "", "exact match 0.10 -> 0.90", {}, 12.4), Section("2. second", "", "pearson 0.80", {}, 61.0)]
    text = summary_markdown(sections, 75.0)
    assert "| 1. first | exact match 0.10 -> 0.90 | 12 s |" in text
    assert "| 2. second | pearson 0.80 | 61 s |" in text
    assert "Total time: 75 s (1.2 min)" in text


@pytest.mark.slow
def test_the_quickstart_writes_its_report_and_runs_again_in_the_same_place(tmp_path, capsys):
    config = QuickstartConfig(
        out_dir=str(tmp_path / "qs"),
        demo=DemoConfig(train_examples=200, eval_examples=20, sft=SFTConfig(steps=4, lr=3e-3, batch_size=16),
                        grpo=GRPOConfig(steps=2, lr=3e-4, prompts_per_step=4, group_size=4, max_new_tokens=10, beta=0.0)),
        rt1_episodes=2, rlvr_episodes=2, rlvr=GRPOConfig(steps=2, lr=3e-5, prompts_per_step=2, group_size=4, beta=0.0),
        ppo_steps=128, ppo_eval_every=64, ppo_envs=4, ppo_eval_episodes=1, policy_episodes=1, policy_skills=(1.0, 0.0),
    )
    for _ in range(2):  # a second run replaces the first instead of refusing to overwrite its trainers' runs
        report = run_quickstart(config)
    out = tmp_path / "qs"
    text = report.read_text()
    for section in ("## Summary", "## 1.", "## 2.", "## 3.", "## 4.", "## 5.", "Total time"):
        assert section in text
    for name in ("demo_curves.png", "rt1_rlvr_reward.png", "rt1_rollouts.gif", "sim_episode.png",
                 "policy_eval/rt1-rlvr/scatter.png", "policy_eval/rt1-mle/scatter.png", "ppo/model.zip"):
        assert (out / name).stat().st_size > 0, name
        if name.endswith(".png") or name.endswith(".gif"):
            assert name in text, f"the report shows {name}"
    summary = json.loads((out / "summary.json").read_text())
    rlvr = summary["sections"]["2. RLVR on the RT-1 video world model"]
    assert rlvr["grpo_steps"] == 2 and all(math.isfinite(rlvr[k]) for k in ("before_lpips", "after_lpips", "shipped_lpips"))
    episode = summary["sections"]["3. The learned simulator as a Gymnasium env"]
    assert episode["real_steps"] >= 1, "the real episode runs to its own end"
    assert episode["sim_steps"] is None or episode["sim_steps"] <= episode["real_steps"]
    assert episode["sim_reward"] in (0.0, 1.0), "the simulator pays 1 on the step it calls success, which ends it"
    assert not episode["sim_reward"] or episode["sim_steps"] is not None
    ppo = summary["sections"]["4. PPO inside the learned simulator"]
    assert ppo["steps"] == 128 and ppo["real_success"] in (0.0, 1.0) and ppo["learned_success"] in (0.0, 1.0)
    assert len((out / "ppo" / "eval.jsonl").read_text().splitlines()) == 2 and "success in the simulator" in text
    policies = summary["sections"]["5. Policy evaluation: learned vs real"]
    assert set(policies) >= {"rt1-rlvr", "rt1-mle", "seconds"}
    assert all(-1.0 <= policies[m]["pearson"] <= 1.0 and 0.0 <= policies[m]["mmrv"] <= 1.0 for m in ("rt1-rlvr", "rt1-mle"))
    assert "quickstart PPO" in text, "the PPO agent is a rung of the ladder"
    assert summary["total_seconds"] >= sum(s["seconds"] for s in summary["sections"].values()) - 1
    assert "Total time" in capsys.readouterr().out
