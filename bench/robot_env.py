"""The real robot env: steps/s with rendering, frame change per action, the scripted-policy ladder, expert frames.

    python -m bench.robot_env     # writes runs/bench/robot_env.md and robot_env_<task>.png

Speed: random actions with task="random", resets included, one process. Ladder: success rate of the scripted
policy per task and skill over the same seeds; a ladder is ordered when success never rises as skill falls.
"""

import os
import time
from pathlib import Path

import numpy as np

from envs.robot import TASKS, RealRT1Env, make_scripted_policy, rollout
from envs.robot.env import FRAME_SKIP, MAX_TRANSLATION
from rlvr_gym.evaluation.report import markdown_table

SKILLS = (1.0, 0.7, 0.4, 0.1)


def measure_speed(steps: int, repeats: int = 3) -> dict:
    """Env steps/s with random actions, resets included: best and median of the repeats (the CPU may be shared)."""
    env = RealRT1Env()
    actions = np.random.default_rng(0).uniform(-1, 1, size=(steps, 7)).astype(np.float32)
    rates = []
    for repeat in range(repeats):
        env.reset(seed=repeat)
        start = time.perf_counter()
        for action in actions:
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                env.reset()
        rates.append(steps / (time.perf_counter() - start))
    env.close()
    return {
        "steps": steps,
        "repeats": repeats,
        "best_steps_per_s": max(rates),
        "median_steps_per_s": float(np.median(rates)),
    }


def changed_pixels(a: np.ndarray, b: np.ndarray) -> int:
    return int((np.abs(a.astype(int) - b.astype(int)).sum(-1) > 30).sum())


def measure_motion(seeds: int) -> list[dict]:
    """Pixels that change in one step under a full-scale move along each axis, against holding still."""
    env = RealRT1Env()
    hold = np.array([0, 0, 0, 0, 0, 0, -1], np.float32)
    rows = []
    for name, axis, direction in [("hold still", None, 0.0), ("x +1", 0, 1.0), ("y +1", 1, 1.0), ("z -1", 2, -1.0)]:
        counts = []
        for seed in range(seeds):
            before, _ = env.reset(seed=seed)
            action = hold.copy()
            if axis is not None:
                action[axis] = direction
            after, *_ = env.step(action)
            counts.append(changed_pixels(before, after))
        rows.append({"action": name, "changed_pixels_mean": float(np.mean(counts)), "changed_pixels_min": min(counts)})
    env.close()
    return rows


def measure_ladder(episodes: int) -> list[dict]:
    rows = []
    for task in TASKS:
        env = RealRT1Env(task=task)
        for skill in SKILLS:
            results = [rollout(env, make_scripted_policy(task, skill, seed), seed)[2][-1] for seed in range(episodes)]
            rows.append(
                {
                    "task": task,
                    "skill": skill,
                    "success": float(np.mean([r["success"] for r in results])),
                    "mean_steps": float(np.mean([r["step"] for r in results])),
                }
            )
            print(rows[-1], flush=True)
        env.close()
    return rows


def is_ordered(success_by_falling_skill: list[float]) -> bool:
    return all(a >= b for a, b in zip(success_by_falling_skill, success_by_falling_skill[1:]))


def expert_strip(task: str, seed: int, path: Path, max_frames: int = 16, scale: int = 3) -> int:
    """Save the frames of one expert episode side by side (evenly subsampled to max_frames); return its steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env = RealRT1Env(task=task)
    frames, actions, _ = rollout(env, make_scripted_policy(task, 1.0, seed), seed)
    env.close()
    keep = np.unique(np.linspace(0, len(frames) - 1, min(max_frames, len(frames))).round().astype(int))
    gap = np.full((64, 2, 3), 255, np.uint8)
    strip = np.concatenate([np.concatenate([frames[i], gap], axis=1) for i in keep], axis=1)[:, :-2]
    plt.imsave(path, strip.repeat(scale, axis=0).repeat(scale, axis=1))
    return len(actions)


def main(out_dir: str = "runs/bench", episodes: int = 30, speed_steps: int = 1000) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    speed = measure_speed(speed_steps)
    print(speed, flush=True)
    motion = measure_motion(seeds=20)
    ladder = measure_ladder(episodes)
    ordered = {task: is_ordered([r["success"] for r in ladder if r["task"] == task]) for task in TASKS}
    strips = {task: expert_strip(task, seed=0, path=out / f"robot_env_{task}.png") for task in TASKS}
    report = [
        "# Real robot env (MuJoCo tabletop, RealRT1-v0)",
        "",
        f"MuJoCo GL backend `{os.environ.get('MUJOCO_GL')}`, 64x64 RGB, {FRAME_SKIP} physics steps of 5 ms per env "
        f"step, full-scale world_vector = {MAX_TRANSLATION} m.",
        "",
        "## Speed (rendering on, random actions, one process)",
        "",
        f"Load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs while measuring.",
        "",
        markdown_table([speed], digits=2),
        "",
        "## Frame change in one step (20 seeds; a pixel changes when its RGB moves by more than 30 in sum)",
        "",
        markdown_table(motion, digits=1),
        "",
        f"## Scripted-policy ladder ({episodes} episodes per cell, seeds 0-{episodes - 1})",
        "",
        markdown_table(ladder, ["task", "skill", "success", "mean_steps"], digits=2),
        "",
        "Ordered (success never rises as skill falls): "
        + ", ".join(f"{task} {'yes' if ok else '**no**'}" for task, ok in ordered.items()),
        "",
        "## Expert episodes (seed 0)",
        "",
        *[f"{task}, {steps} steps:\n\n![{task}](robot_env_{task}.png)\n" for task, steps in strips.items()],
    ]
    (out / "robot_env.md").write_text("\n".join(report))
    return {"speed": speed, "motion": motion, "ladder": ladder, "ordered": ordered}


if __name__ == "__main__":
    main()
