"""What every training run shares: its config, processes (torchrun / DDP), checkpoints, resume and logs.

A run directory holds
    config.json                the run's config; a resume with another config is refused
    log.jsonl                  one line of metrics per logged step (rank 0)
    tb/                        the same scalars for TensorBoard
    checkpoints/step_000123/   Hugging Face model dir (config.json, model.safetensors, tokenizer) + trainer_state.pt
    checkpoints/latest         name of the newest complete checkpoint
    final/                     the trained model, a Hugging Face dir
Checkpoints are written to a temporary directory and renamed into place, so a run killed at any moment leaves
the previous checkpoint intact, and `--resume` continues from it with the same data order and random streams.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist
from tqdm import tqdm

from rlvr_gym.files import LOG_FILE, atomic_write_text
from rlvr_gym.models.lm import CheckpointError, load_model

log = logging.getLogger("rlvr_gym")


@dataclass
class RunConfig:
    run_dir: str = "runs/train"
    """Directory for checkpoints, logs and the final model."""
    model: str = ""
    """Model to start from: a shipped checkpoint name or a local Hugging Face directory."""
    steps: int = 100
    """Optimizer steps in the whole run."""
    lr: float = 1e-4
    """Peak learning rate (AdamW)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 0
    """Linear warm-up steps; the rate is constant afterwards."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0: off)."""
    seed: int = 0
    """Seed of the data order and of sampling; a resumed run replays the same streams."""
    save_every: int = 50
    """Checkpoint every this many steps (and at the end)."""
    keep_checkpoints: int = 2
    """How many of the newest checkpoints to keep."""
    log_every: int = 1
    """Log metrics every this many steps."""
    eval_every: int = 0
    """Evaluate every this many steps (0: only at the end)."""
    resume: bool = False
    """Continue from the newest checkpoint in run_dir (starts fresh if there is none)."""
    threads: int = 1
    """torch threads per process; on small CPUs one thread per process and more processes (torchrun) is faster."""
    max_minutes: float = 0.0
    """Stop after this many minutes of this process (0: no limit), saving a checkpoint and final/ as at the last
    step; --resume continues to `steps`. For fixed time budgets (a lent GPU, a CI slot)."""


# Fields that may differ when resuming: they change how the run is watched or how far it goes, not what it computes.
RESUMABLE_CHANGES = {"resume", "steps", "save_every", "keep_checkpoints", "log_every", "eval_every", "threads",
                     "max_minutes"}


Nested = TypeVar("Nested", bound=RunConfig)
T = TypeVar("T")


def set_by_command(nested: Nested, flag: str, **values) -> Nested:
    """`nested` (a pipeline's --sft or --grpo settings) with the fields the pipeline sets from its own options.

    Those fields still appear on the command line as --FLAG.NAME; one given there would be dropped without a word
    (a run written somewhere else, a --FLAG.resume that starts over), so it is refused, naming the value used.
    """
    defaults = type(nested)()
    for name, value in values.items():
        given = getattr(nested, name)
        if given != getattr(defaults, name) and given != value:
            raise ValueError(f"--{flag}.{name.replace('_', '-')} is set by this command from its own options (here to "
                             f"{value!r}); got {given!r}: use the command's own option (see --help)")
    return dataclasses.replace(nested, **values)


# ---------------------------------------------------------------------------------------------------- processes


@dataclass
class Dist:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_processes(threads: int) -> Dist:
    """Join the torchrun process group when launched by torchrun (gloo on CPU, nccl on GPUs)."""
    torch.set_num_threads(threads)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return Dist(0, 1, device)
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30))
    return Dist(dist.get_rank(), dist.get_world_size(), device)


def barrier(d: Dist) -> None:
    if d.world_size > 1:
        dist.barrier()


def mean_across_ranks(d: Dist, metrics: dict[str, float]) -> dict[str, float]:
    if d.world_size == 1 or not metrics:
        return metrics
    keys = sorted(metrics)
    values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=d.device)  # nccl: GPU only
    dist.all_reduce(values)
    return {k: v / d.world_size for k, v in zip(keys, values.tolist())}


def map_across_ranks(d: Dist, items: Sequence[T], fn: Callable[[list[T]], list]) -> list:
    """`fn` over `items` shared out: each rank takes every world_size-th item (long and short ones alike), and every
    rank gets all the results, in the order of `items`. For a scan every rank needs whole, such as decoding the
    training prompts before the prompts are weighted."""
    mine = fn(list(items[d.rank :: d.world_size]))
    if d.world_size == 1:
        return mine
    parts: list[list | None] = [None] * d.world_size
    dist.all_gather_object(parts, mine)
    results: list = [None] * len(items)
    for rank, part in enumerate(parts):
        results[rank :: d.world_size] = part
    return results


def any_rank(d: Dist, flag: bool) -> bool:
    """True on every rank when it is true on any (so that all ranks leave a loop at the same step)."""
    if d.world_size == 1:
        return flag
    value = torch.tensor([float(flag)], device=d.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def wrap_ddp(model: torch.nn.Module, d: Dist) -> torch.nn.Module:
    if d.world_size == 1:
        return model
    device_ids = [d.device.index] if d.device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def step_generator(seed: int, step: int, rank: int, stream: int = 0) -> torch.Generator:
    """A random stream fixed by (seed, step, rank): a resumed run draws exactly what the killed one would have."""
    return torch.Generator().manual_seed(((seed * 1_000_003 + step) * 1_009 + rank) * 7 + stream)


def shard_order(n: int, seed: int, epoch: int, rank: int, world_size: int) -> list[int]:
    """This rank's share of a seeded permutation of range(n) for one epoch."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()
    return order[rank::world_size]


def batch_indices(n: int, batch_size: int, step: int, seed: int, rank: int, world_size: int) -> list[int]:
    """The example indices of this rank at this step: epochs of seeded permutations, sharded by rank."""
    if n < world_size:
        raise ValueError(f"{n} examples cannot be sharded over {world_size} processes")
    per_epoch = n // world_size  # equal shards, so every rank takes the same number of steps per epoch
    out = []
    position = step * batch_size
    while len(out) < batch_size:
        epoch, offset = divmod(position, per_epoch)
        shard = shard_order(n, seed, epoch, rank, world_size)[:per_epoch]
        take = min(batch_size - len(out), per_epoch - offset)
        out += shard[offset : offset + take]
        position += take
    return out


# ---------------------------------------------------------------------------------------------------- run dir


def prepare_run_dir(config: RunConfig, d: Dist) -> Path:
    """Create run_dir, or check that a resumed run uses the same config; refuse to overwrite a finished run."""
    run_dir = Path(config.run_dir)
    record_config(run_dir, config, config.resume, d.is_main)
    barrier(d)
    return run_dir


def record_config(run_dir: Path, config, resume: bool, is_main: bool, file_name: str = "config.json",
                  resumable: set[str] = RESUMABLE_CHANGES) -> None:
    """Refuse to start over a run's checkpoints without --resume, or to resume it with another config; save config.

    Fields named in `resumable` may differ. A field the saved config lacks (added to the code since) counts as its
    default, which is what the run used. Domain pipelines record their outer config too, in their own file.
    """
    run_dir = Path(run_dir)
    saved = run_dir / file_name
    current = json.loads(json.dumps(dataclasses.asdict(config)))  # as saved: tuples become lists
    if latest_checkpoint(run_dir) is not None and not resume:
        raise FileExistsError(
            f"{run_dir} already holds checkpoints: pass --resume to continue that run, or choose another --run-dir"
        )
    if resume and saved.is_file():
        previous = {**field_defaults(config), **json.loads(saved.read_text())}
        keys = (set(previous) | set(current)) - resumable
        differing = sorted(k for k in keys if previous.get(k) != current.get(k))
        if differing:
            changes = ", ".join(f"{k}: {previous.get(k)!r} -> {current.get(k)!r}" for k in differing)
            raise ValueError(f"cannot resume {run_dir} with a different config ({changes}); use a new --run-dir")
    if is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(saved, json.dumps(current, indent=2))


def field_defaults(config) -> dict:
    """The config's fields at their defaults, as saved (fields without a default are left out)."""
    defaults = {}
    for f in dataclasses.fields(config):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    return json.loads(json.dumps(defaults, default=lambda o: dataclasses.asdict(o)))


# ---------------------------------------------------------------------------------------------------- checkpoints


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    if not path.is_dir():
        raise CheckpointError(f"{pointer} names {path.name}, which does not exist: the run directory was damaged")
    return path


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    tokenizer,
    optimizer: torch.optim.Optimizer,
    scheduler,
    keep: int,
    extra: dict | None = None,
) -> Path:
    """Write step_NNNNNN atomically (temp dir + rename), point `latest` at it, prune old ones. Rank 0 only."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    unwrap(model).save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    state = {
        "step": step,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "extra": extra or {},
    }
    torch.save(state, tmp / "trainer_state.pt")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    atomic_write_text(root / "latest", final.name)
    steps = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in steps[: max(0, len(steps) - keep)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, optimizer: torch.optim.Optimizer, scheduler) -> tuple[int, dict]:
    """Restore optimizer, scheduler and RNG from a checkpoint dir; returns (step, extra)."""
    state_file = Path(path) / "trainer_state.pt"
    if not state_file.is_file():
        raise CheckpointError(f"checkpoint {path} has no trainer_state.pt: it cannot be resumed")
    try:
        state = torch.load(state_file, map_location="cpu", weights_only=True)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
    except Exception as error:
        raise CheckpointError(f"checkpoint {state_file} is corrupt ({type(error).__name__}: {error})") from error
    return int(state["step"]), state.get("extra", {})


def make_optimizer(model: torch.nn.Module, config: RunConfig):
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    warmup = max(1, config.warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    return optimizer, scheduler


def final_dir(run_dir: str | os.PathLike) -> Path:
    """Where a run's trained model lands (what `train_sft` and `train_grpo` return)."""
    return Path(run_dir) / "final"


def save_final(run_dir: Path, model: torch.nn.Module, tokenizer) -> Path:
    final = final_dir(run_dir)
    tmp = Path(run_dir) / ".tmp_final"
    shutil.rmtree(tmp, ignore_errors=True)
    unwrap(model).save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


# ---------------------------------------------------------------------------------------------------- the run


class Run:
    """The parts of a training loop every trainer shares: processes, model, optimizer, resume, logs, checkpoints.

        run = Run(config, "sft")
        while run.running():
            loss = ...; loss.backward(); run.optimizer_step()
            run.end_step({"train/loss": ...}, evaluate=...)
        return run.finish()
    """

    def __init__(self, config: RunConfig, name: str, load: Callable[[str | os.PathLike], tuple] = load_model):
        """`load(path) -> (model, tokenizer or None)` reads config.model or, with --resume, the newest checkpoint."""
        self.config = config
        self.d = setup_processes(config.threads)
        self.run_dir = prepare_run_dir(config, self.d)
        latest = latest_checkpoint(self.run_dir) if config.resume else None
        if latest is None and not config.model:
            raise ValueError("no model to start from: pass --model (a shipped checkpoint name or a HF directory)")
        self.model, self.tokenizer = load(latest or config.model)
        self.model.to(self.d.device)
        self.optimizer, self.scheduler = make_optimizer(self.model, config)
        self.step = load_checkpoint(latest, self.optimizer, self.scheduler)[0] if latest is not None else 0
        self.ddp_model = wrap_ddp(self.model, self.d)
        self.logger = MetricsLogger(self.run_dir, self.d.is_main, resumed_step=self.step)
        self.bar = tqdm(total=config.steps, initial=self.step, desc=name, disable=not self.d.is_main, dynamic_ncols=True)
        self.started = time.monotonic()
        self.out_of_time = False

    def running(self) -> bool:
        """Whether the loop should take another step: steps remain and the time limit, if any, is not reached."""
        return self.step < self.config.steps and not self.out_of_time

    def optimizer_step(self) -> float:
        """Clip gradients, step optimizer and schedule, clear gradients; returns the gradient norm."""
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm or float("inf"))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def evaluate(self, eval_fn: Callable[[], dict[str, float]] | None) -> None:
        """Run eval_fn on rank 0 (model in eval mode) and log its metrics under eval/ at the current step."""
        if eval_fn is not None and self.d.is_main:
            self.model.eval()
            metrics = eval_fn()
            if metrics:
                self.logger.log(self.step, {f"eval/{k}": v for k, v in metrics.items()})
        barrier(self.d)

    def end_step(self, metrics: dict[str, float], eval_fn: Callable[[], dict[str, float]] | None = None,
                 postfix: Sequence[str] = ()) -> dict[str, float]:
        """Count the step; average, log and show its metrics; checkpoint and evaluate when due."""
        config = self.config
        self.step += 1
        limit = config.max_minutes * 60
        self.out_of_time = any_rank(self.d, bool(limit) and time.monotonic() - self.started >= limit)
        if self.out_of_time and self.step < config.steps:
            log.info("stopping at step %d of %d: the %g-minute limit is reached (--resume continues)", self.step,
                     config.steps, config.max_minutes)
        last = self.step == config.steps or self.out_of_time
        metrics = mean_across_ranks(self.d, {**metrics, "train/lr": self.scheduler.get_last_lr()[0]})
        if self.step % config.log_every == 0 or last:
            self.logger.log(self.step, metrics)
        self.bar.update(1)
        self.bar.set_postfix({k.split("/")[-1]: f"{metrics[k]:.3f}" for k in postfix})
        if self.step % config.save_every == 0 or last:
            if self.d.is_main:
                save_checkpoint(self.run_dir, self.step, self.model, self.tokenizer, self.optimizer, self.scheduler,
                                config.keep_checkpoints)
            barrier(self.d)
        if (config.eval_every and self.step % config.eval_every == 0) or last:
            self.evaluate(eval_fn)
        return metrics

    def finish(self) -> Path:
        """Save the final model (run_dir/final) and close the logs; returns the final model's directory."""
        self.bar.close()
        final = final_dir(self.run_dir)
        if self.d.is_main:
            final = save_final(self.run_dir, self.model, self.tokenizer)
        barrier(self.d)
        self.logger.close()
        return final


# ---------------------------------------------------------------------------------------------------- logs


class MetricsLogger:
    """Scalars to log.jsonl and TensorBoard (rank 0); on resume, drops lines past the resumed step."""

    def __init__(self, run_dir: Path, enabled: bool, resumed_step: int = 0):
        self.enabled = enabled
        self.path = Path(run_dir) / LOG_FILE
        self.writer = None
        if not enabled:
            return
        if self.path.is_file():
            kept = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] <= resumed_step]
            atomic_write_text(self.path, "".join(line + "\n" for line in kept))
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(Path(run_dir) / "tb"), purge_step=resumed_step + 1 if resumed_step else None)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        record = {"step": step, "time": time.time(), **{k: float(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


