"""`make quickstart`: the main job on embedded defaults, ending in a report under runs/quickstart/.

1. The RLVR trainer on a verifiable task: SFT, then GRPO, on sorting digits (the trainer's own proof).
2. The shipped RT-1 video world models (MLE and RLVR) against fresh episodes of the real MuJoCo tabletop,
   with the copy-last-frame baselines, and a GIF of real vs imagined rollouts.
3. The learned simulator as a Gymnasium env: one episode of `RLVRWorld-RT1-v0` under a scripted policy.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlvr_gym.evaluation.report import markdown_table, plot_curves
from rlvr_gym.train.demo import DemoConfig, run_demo


@dataclass
class QuickstartConfig:
    out_dir: str = "runs/quickstart"
    """Where the runs and report.md go."""
    demo: DemoConfig = field(default_factory=DemoConfig)
    """The trainer demonstration: SFT then GRPO on an exact-match task."""
    rt1_episodes: int = 6
    """Fresh real tabletop episodes on which the shipped RT-1 world models are scored."""
    rt1_seed: int = 424242
    """Collection seed of those episodes (never used for training data)."""


def trainer_section(config: QuickstartConfig, out: Path) -> str:
    summary = run_demo(DemoConfig(**{**vars(config.demo), "run_dir": str(out / "demo")}))
    plot = plot_curves(
        {"sft": out / "demo" / "sft", "grpo": out / "demo" / "grpo"},
        ["eval/exact_match", "reward/mean", "train/entropy"],
        out / "demo_curves.png",
        title="sort-digits: SFT then GRPO (held-out exact match, greedy; steps of each run)",
    )
    rows = [
        {"model": "SFT", "held-out exact match": summary["exact_match_sft"]},
        {"model": "SFT + GRPO", "held-out exact match": summary["exact_match_grpo"]},
    ]
    return (
        "## 1. The RLVR trainer on a verifiable task\n"
        "A small Llama trained from scratch to sort the digits of its prompt: briefly by SFT, then by GRPO on the "
        "exact-match reward. Held-out prompts come from a seed never used in training.\n\n"
        f"{markdown_table(rows)}\n\n![curves]({plot.name})\n\n"
    )


def robot_section(config: QuickstartConfig, out: Path) -> str:
    from rlvr_gym.data.episodes import CollectConfig, collect, load_episodes
    from rlvr_gym.evaluation.robot import evaluate_world_model, rollout_gif, summary_line
    from rlvr_gym.models.robot_world_model import RobotWorldModel

    with tempfile.TemporaryDirectory() as tmp:
        collect(CollectConfig(out=tmp + "/eval", episodes=config.rt1_episodes, seed=config.rt1_seed, horizon=30, split="eval"))
        episodes = load_episodes(tmp + "/eval")
    worlds = {name: RobotWorldModel.load(name) for name in ("rt1-mle", "rt1-rlvr")}
    lines = {name: summary_line(evaluate_world_model(world, episodes, horizon=5)) for name, world in worlds.items()}
    first = next(iter(lines.values()))
    rows = [{"model": "copy last real frame", "psnr": first["copy_last_frame_psnr"],
             "changed_mse": first["copy_last_frame_changed_mse"], "object_error_px": first["copy_last_frame_object_error_px"]}]
    rows += [{"model": name, "psnr": l["psnr"], "lpips": l["lpips"], "changed_mse": l["single_changed_mse"],
              "object_error_px": l["single_object_error_px"], "5-step lpips": l["multi_lpips"],
              "5-step repetition": l["multi_repetition_rate"]} for name, l in lines.items()]
    gif = rollout_gif(worlds, max(episodes, key=len), 12, out / "rt1_rollouts.gif")
    (out / "rt1_eval.json").write_text(json.dumps(lines, indent=2))
    return (
        "## 2. The shipped RT-1 video world models on fresh real episodes\n"
        f"{len(episodes)} new episodes of the MuJoCo tabletop (seed {config.rt1_seed}); single-step predictions from the real "
        "history, and 5-step rollouts with the real actions spliced between generated frames. `changed_mse` is the MSE on "
        "the pixels that changed, `object_error_px` the error of object positions read from the frames.\n\n"
        f"{markdown_table(rows, digits=4)}\n\nReal (left), MLE, RLVR, imagined from the first frame: ![rollouts]({gif.name})\n\n"
    )


def simulator_section(out: Path) -> str:
    """One episode imagined by RLVRWorld-RT1-v0 next to the real env from the same initial state and actions."""
    import gymnasium as gym
    from PIL import Image

    import rlvr_gym  # noqa: F401  (registers the env ids)
    from envs.robot import make_scripted_policy
    from rlvr_gym.models.robot_world_model import RobotWorldModel
    from rlvr_gym.sim.robot import load_initial_states

    sim = gym.make("RLVRWorld-RT1-v0")
    obs, info = sim.reset(seed=0)
    # The initial states remember the real-env seed they were recorded with: the real env starts where the sim does.
    states = load_initial_states(RobotWorldModel.resolve("rt1-rlvr"))
    real = gym.make("RealRT1-v0", task=info["task"])
    real_obs, real_info = real.reset(seed=int(states.seeds[info["initial_state"]]))
    policy = make_scripted_policy(info["task"], skill=1.0, seed=0)
    pairs, total, steps = [np.concatenate([real_obs, obs], 0)], 0.0, 0
    for steps in range(1, 31):
        action = policy(real_obs, real_info)
        obs, reward, terminated, truncated, info = sim.step(action)
        real_obs, _, real_done, _, real_info = real.step(action)
        pairs.append(np.concatenate([real_obs, obs], 0))
        total += reward
        if terminated or truncated or real_done:
            break
    shown = pairs[:: max(1, len(pairs) // 8)][:8]
    Image.fromarray(np.concatenate(shown, 1)).resize((128 * len(shown), 256), Image.NEAREST).save(out / "sim_episode.png")
    sim.close()
    real.close()
    return (
        "## 3. The learned simulator as a Gymnasium env\n"
        "`gym.make(\"RLVRWorld-RT1-v0\")` (the shipped RLVR model) and the real env, from the same initial state, "
        f"stepped with an expert's actions for `{info['task']}`: {steps} steps; the simulator predicted reward {total:.0f} "
        f"(last success probability {info['success_prob']:.2f}), the real env {'succeeded' if real_info['success'] else 'did not succeed'}. "
        "Top row real, bottom row imagined:\n\n![imagined episode](sim_episode.png)\n\n"
    )


def run_quickstart(config: QuickstartConfig) -> Path:
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    sections = [trainer_section(config, out), robot_section(config, out), simulator_section(out)]
    report = out / "report.md"
    report.write_text("# rlvr-gym quickstart\n\n" + "".join(sections) + f"Total time: {time.time() - started:.0f} s.\n")
    return report
