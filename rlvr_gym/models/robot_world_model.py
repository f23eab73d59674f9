"""The robot video world model: a frame tokenizer plus an action-conditioned causal LM over its tokens.

A checkpoint directory holds
    lm/               Hugging Face causal LM over rlvr_gym.domains.robot's token layout
    frame_tokenizer/  FrameTokenizer (safetensors)
    motion_refiner/   MotionRefiner (optional): moves the last frame's pixels where the decoder would redraw them
    state_reader/     StateReader (optional): reads the state off the frames shown, which the simulator's success is
                      then decided from (else from the transformer's success flag)
    state_dynamics/   StateDynamics (optional): steps the true state under the actions beside the frames; the
                      simulator then decides success from the state it predicts (before a reader or the flag)
    world_model.json  context_steps and the layout the LM was trained with (codebook, tokens per frame, vocabulary)
Rollouts keep at most `context_steps` past steps in the prompt (the window slides, as in RLVR-World).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from rlvr_gym.data import video_tokens as V
from rlvr_gym.models.frame_tokenizer import FrameTokenizer
from rlvr_gym.models.lm import SHIPPED_DIR, CheckpointError, load_model, pick_device, resolve_checkpoint
from rlvr_gym.models.motion_refiner import MotionRefiner
from rlvr_gym.models.sampler import SamplingConfig, sample
from rlvr_gym.models.state_dynamics import StateDynamics
from rlvr_gym.models.state_reader import StateReader


def layout(frame_tokens: int) -> dict[str, int]:
    """The token layout a world model's transformer was trained with; the tokenizer sets the tokens per frame."""
    return {"codebook_size": V.CODEBOOK_SIZE, "frame_tokens": frame_tokens, "vocab_size": V.VOCAB_SIZE}


DEFAULT_SUCCESS_THRESHOLD = 0.5
# Frames decoded per forward pass in decode_rollout.
DECODE_BATCH = 256
PRECISIONS = ("float32", "bfloat16")
"""How a world model runs its products with weights: "float32", or "bfloat16" (the transformer's matrix products
and the frame networks' convolutions in bfloat16, about 1.7x the batched simulator's throughput on a CPU with
AVX-512 BF16, `python -m bench.rt1_sim`; its frames and success calls differ slightly from float32's)."""


@dataclass
class WorldModelSettings:
    context_steps: int = 2
    """Past steps (frame, flag, action) kept in the prompt when predicting the next frame."""
    success_thresholds: dict[str, float] = field(default_factory=dict)
    """Per task, the success probability above which the simulator calls a frame a success (tasks not listed:
    0.5). Set by `rlvr-gym calibrate rt1` from open-loop replays of training episodes."""
    context_from_frames: bool = False
    """How a predicted frame enters the next prompt. False: as the codes the transformer generated. True: as the
    tokenizer's codes of the frame shown (decoded and motion-refined), so the rollout's state is what the agent
    sees. With a refiner this keeps objects the codes would drop: a refined frame that still shows an object encodes
    to codes that show it. `train refiner` sets it."""
    success_hold: int = 1
    """Consecutive predicted frames whose success probability must exceed the threshold before the simulator calls
    success (on the last of them). A success the real env gives persists (the drawer stays shut); many the world
    model invents last one frame (`python -m bench.rt1_guard` measures 1 against 2 and 3)."""

    def __post_init__(self):
        if not isinstance(self.success_hold, int) or self.success_hold < 1:
            raise ValueError(f"success_hold must be an int >= 1, got {self.success_hold!r}")

    def success_threshold(self, task: str) -> float:
        return self.success_thresholds.get(task, DEFAULT_SUCCESS_THRESHOLD)


def load_network(cls: type, path: str | os.PathLike, what: str):
    """A saved Hugging Face network of class `cls` in fp32 and eval mode, or a CheckpointError naming `what` failed."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path} holds no {what} (config.json missing)")
    try:
        return cls.from_pretrained(path, dtype=torch.float32).eval()
    except Exception as error:
        raise CheckpointError(f"{what} in {path} could not be loaded ({type(error).__name__}: {error})") from error


def load_frame_tokenizer(path: str | os.PathLike) -> FrameTokenizer:
    return load_network(FrameTokenizer, path, "frame tokenizer")


def load_motion_refiner(path: str | os.PathLike) -> MotionRefiner:
    return load_network(MotionRefiner, path, "motion refiner")


def load_state_reader(path: str | os.PathLike) -> StateReader:
    return load_network(StateReader, path, "state reader")


def load_state_dynamics(path: str | os.PathLike) -> StateDynamics:
    return load_network(StateDynamics, path, "state dynamics")


@dataclass
class RolloutStart:
    """The real frames k-step rollouts start from, one row per prompt, so that each frame can be decoded as it is
    predicted (what `RobotWorldModel.decode_rollout` takes)."""

    last: np.ndarray
    """(P, 64, 64, 3) the prompt's last frame."""
    first: np.ndarray
    """(P, 64, 64, 3) the episode's first frame."""
    before: np.ndarray
    """(P, 64, 64, 3) the frame before `last` (`last` itself at an episode's first step)."""
    action: np.ndarray
    """(P, 7) the prompt's last action: the one whose outcome is the first predicted frame."""

    def rows(self, index) -> RolloutStart:
        return RolloutStart(*(np.asarray(x)[index] for x in (self.last, self.first, self.before, self.action)))

    @classmethod
    def of_episodes(cls, episodes, where) -> RolloutStart:
        """The real frames behind prompts ending at step t of episode i (episodes with `frames` and `actions`), for
        each (i, t) in `where`."""
        stack = lambda pick: np.stack([pick(episodes[i], t) for i, t in where])  # noqa: E731
        return cls(stack(lambda e, t: e.frames[t]), stack(lambda e, t: e.frames[0]),
                   stack(lambda e, t: e.frames[max(t - 1, 0)]), stack(lambda e, t: e.actions[t]))


@dataclass
class Rollout:
    """What `RobotWorldModel.rollout` returns: rows are prompt-major (prompt i's samples are rows i*num_samples ...)."""

    codes: np.ndarray
    """(rows, k, frame_tokens) the generated codes; -1 from an unparsable frame on."""
    success: np.ndarray
    """(rows, k) the success head's probability for each frame."""
    errors: list[str | None]
    """Per row, the first parse error met."""
    frames: np.ndarray | None = None
    """(rows, k, 64, 64, 3) the frames shown (decoded and refined), when the rollout had a `RolloutStart`."""
    context: np.ndarray | None = None
    """(rows, k, frame_tokens) the codes each frame entered the next prompt as (see `context_from_frames`)."""
    uncertainty: np.ndarray | None = None
    """(rows, k) the transformer's mean negative log-likelihood (nats per code) of the codes it generated for each
    frame: low where it copies or moves what it has seen, high where it is guessing."""

    def select(self, rows) -> Rollout:
        """The rollout's rows `rows` (an index array), in that order."""
        rows = np.asarray(rows)
        pick = lambda x: None if x is None else x[rows]
        return Rollout(self.codes[rows], self.success[rows], [self.errors[i] for i in rows], pick(self.frames),
                       pick(self.context), pick(self.uncertainty))

    @staticmethod
    def concatenate(parts: list[Rollout]) -> Rollout:
        join = lambda name: None if getattr(parts[0], name) is None else np.concatenate([getattr(p, name) for p in parts])
        return Rollout(join("codes"), join("success"), [e for p in parts for e in p.errors], join("frames"),
                       join("context"), join("uncertainty"))


class RobotWorldModel:
    def __init__(self, lm: torch.nn.Module, frame_tokenizer: FrameTokenizer, settings: WorldModelSettings,
                 refiner: MotionRefiner | None = None, state_reader: StateReader | None = None,
                 state_dynamics: StateDynamics | None = None, precision: str = "float32"):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if lm.config.vocab_size != V.VOCAB_SIZE:
            raise CheckpointError(f"the transformer's vocabulary ({lm.config.vocab_size}) is not the robot layout's ({V.VOCAB_SIZE})")
        tok_config = frame_tokenizer.config
        if tok_config.codebook_size != V.CODEBOOK_SIZE:
            raise CheckpointError(
                f"tokenizer/transformer mismatch: the frame tokenizer has {tok_config.codebook_size} codes, "
                f"the transformer expects {V.CODEBOOK_SIZE}"
            )
        self.lm = lm.eval()
        self.frame_tokenizer = frame_tokenizer.eval()
        self.settings = settings
        self.refiner = refiner.eval() if refiner is not None else None
        self.state_reader = state_reader.eval() if state_reader is not None else None
        self.state_dynamics = state_dynamics.eval() if state_dynamics is not None else None
        self.precision = precision
        for network in (self.frame_tokenizer, self.refiner):
            if network is not None:  # oneDNN's convolutions run faster on NHWC weights: refiner 1.8x, decoder 1.4x here
                network.to(memory_format=torch.channels_last)
        if refiner is not None and refiner.config.image_size != tok_config.image_size:
            raise CheckpointError(f"the motion refiner works on {refiner.config.image_size}px frames, the tokenizer's "
                                  f"are {tok_config.image_size}px")

    def tokens_only(self) -> RobotWorldModel:
        """The transformer and tokenizer alone, rolled out as RLVR-World rolls out and as GRPO trains it: frames
        decoded from the codes without the motion refiner, and each frame's generated codes fed back into the prompt.
        The comparison of RLVR with MLE on the transformer's own frames (`eval rt1 --tokens-only`)."""
        settings = replace(self.settings, context_from_frames=False)
        return RobotWorldModel(self.lm, self.frame_tokenizer, settings, None, self.state_reader, self.state_dynamics,
                               self.precision)

    @property
    def frame_tokens(self) -> int:
        """Codes per frame, the tokenizer's grid (8x8 for the shipped models)."""
        return self.frame_tokenizer.config.tokens_per_side**2

    @property
    def step_tokens(self) -> int:
        return V.step_length(self.frame_tokens)

    @staticmethod
    def resolve(name_or_dir: str | os.PathLike) -> Path:
        path = Path(name_or_dir)
        if path.is_dir():
            return path
        if (SHIPPED_DIR / str(name_or_dir)).is_dir():
            return SHIPPED_DIR / str(name_or_dir)
        raise CheckpointError(f"world model {str(name_or_dir)!r} is neither a directory nor a shipped checkpoint name")

    @classmethod
    def load(cls, name_or_dir: str | os.PathLike, device: str | torch.device = "cpu",
             precision: str = "float32") -> RobotWorldModel:
        """A world model from a directory or shipped name, on `device` ("cpu", "cuda", "cuda:1", "auto" = the first
        GPU if there is one), running in `precision` (one of PRECISIONS; the weights stay float32 either way)."""
        device = pick_device(device)
        path = cls.resolve(name_or_dir)
        meta_file = path / "world_model.json"
        if not meta_file.is_file():
            raise CheckpointError(f"{path} is not a robot world model: world_model.json is missing")
        try:
            meta = json.loads(meta_file.read_text())
        except json.JSONDecodeError as error:
            raise CheckpointError(f"{meta_file} is corrupt: {error}") from error
        try:
            settings = WorldModelSettings(**meta["settings"])
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{meta_file} has no valid settings ({error}); this code reads {list(asdict(WorldModelSettings()))}") from None
        frame_tokenizer = load_frame_tokenizer(path / "frame_tokenizer")
        expected = layout(frame_tokenizer.config.tokens_per_side**2)
        if meta.get("layout") != expected:
            raise CheckpointError(f"{path} was trained with token layout {meta.get('layout')}; this code and its frame "
                                  f"tokenizer make {expected}")
        lm, _ = load_model(resolve_checkpoint(path / "lm"))
        refiner = load_motion_refiner(path / "motion_refiner") if (path / "motion_refiner").exists() else None
        reader = load_state_reader(path / "state_reader") if (path / "state_reader").exists() else None
        dynamics = load_state_dynamics(path / "state_dynamics") if (path / "state_dynamics").exists() else None
        return cls(lm, frame_tokenizer, settings, refiner, reader, dynamics, precision).to(device)

    @property
    def device(self) -> torch.device:
        return next(self.lm.parameters()).device

    def to(self, device: str | torch.device) -> RobotWorldModel:
        """The networks to `device`; frames and codes still come and go as numpy arrays."""
        for _, module in self.networks():
            module.to(device)
        return self

    @property
    def matmul_dtype(self) -> torch.dtype | None:
        """The type of the transformer's matrix products (`sample`'s matmul_dtype): None is the weights' own."""
        return torch.bfloat16 if self.precision == "bfloat16" else None

    def autocast(self) -> torch.autocast:
        """The frame networks' forward passes in the world model's precision."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bfloat16")

    def networks(self) -> list[tuple[str, torch.nn.Module]]:
        """The networks and their directory names in a checkpoint."""
        named = [("lm", self.lm), ("frame_tokenizer", self.frame_tokenizer), ("motion_refiner", self.refiner),
                 ("state_reader", self.state_reader), ("state_dynamics", self.state_dynamics)]
        return [(name, module) for name, module in named if module is not None]

    def save(self, path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Path:
        """Write the checkpoint directory; dtype=torch.float16 halves it for shipping (loading casts back)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        for name, module in self.networks():
            original = next(module.parameters()).dtype
            module.to(dtype).save_pretrained(path / name, safe_serialization=True)
            module.to(original)
        for name, module in (("motion_refiner", self.refiner), ("state_reader", self.state_reader),
                             ("state_dynamics", self.state_dynamics)):
            if module is None and (path / name).exists():
                shutil.rmtree(path / name)  # a model without one must not load an old one back
        self.save_settings(path)
        return path

    def save_settings(self, path: str | os.PathLike) -> Path:
        """Write world_model.json alone: the layout and settings, e.g. after calibrating the success thresholds."""
        target = Path(path) / "world_model.json"
        tmp = target.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"layout": layout(self.frame_tokens), "settings": asdict(self.settings)}, indent=2))
        os.replace(tmp, target)
        return target

    def ship(self, source_dir: str | os.PathLike, name: str, card: str) -> Path:
        """Write this model as a shipped checkpoint (fp16) under rlvr_gym/checkpoints/NAME with its card and states."""
        target = self.save(SHIPPED_DIR / name, dtype=torch.float16)
        shutil.copy2(Path(source_dir) / "initial_states.npz", target / "initial_states.npz")
        if (Path(source_dir) / "real_env.json").is_file():  # the real-env releases the initial states came from
            shutil.copy2(Path(source_dir) / "real_env.json", target / "real_env.json")
        (target / "CARD.md").write_text(card)
        return target

    # ------------------------------------------------------------------------------------------ frames

    def encode(self, frames: np.ndarray, context: np.ndarray) -> np.ndarray:
        """uint8 frames (N, 64, 64, 3) with context frames (N or 1, ...) -> codes (N, frame_tokens)."""
        frames_t = torch.as_tensor(np.ascontiguousarray(frames))
        context_t = torch.as_tensor(np.ascontiguousarray(context)).expand(len(frames_t), -1, -1, -1)
        with self.autocast():
            return self.frame_tokenizer.encode(frames_t, context_t).numpy()

    def decode(self, codes: np.ndarray, context: np.ndarray) -> np.ndarray:
        """Codes (N, frame_tokens) with context frames (N or 1, 64, 64, 3) -> uint8 frames (N, 64, 64, 3)."""
        codes_t = torch.as_tensor(np.asarray(codes, dtype=np.int64))
        context_t = torch.as_tensor(np.ascontiguousarray(context)).expand(len(codes_t), -1, -1, -1)
        with self.autocast():
            return self.frame_tokenizer.decode(codes_t, context_t).numpy()

    def refine(self, before: np.ndarray, last: np.ndarray, decoded: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """The motion refiner's frames (`MotionRefiner.refine`) in the world model's precision."""
        with self.autocast():
            return self.refiner.refine(before, last, decoded, actions)

    @property
    def context_frame(self) -> str:
        return self.frame_tokenizer.config.context_frame

    def decode_rollout(self, codes: np.ndarray, start: np.ndarray, first: np.ndarray, before: np.ndarray | None = None,
                       actions: np.ndarray | None = None) -> np.ndarray:
        """Codes (N, k, frame_tokens) of k frames predicted from the real frames `start` (N, 64, 64, 3) -> frames
        (N, k, 64, 64, 3).

        A tokenizer conditioned on the episode's `first` frame decodes them all against it; one conditioned on the
        previous frame decodes them in order, each against the one decoded before (the first against `start`).
        With a motion refiner each decoded frame is refined in order from the two frames before it, so it also
        needs `before`, the real frame before `start` (`start` itself at an episode's first step), and `actions`
        (N, k, 7), the action that led to each frame.
        """
        codes = np.asarray(codes)
        if codes.ndim != 3 or codes.shape[2] != self.frame_tokens:
            raise ValueError(f"expected codes of shape (N, k, {self.frame_tokens}), got {codes.shape}")
        n, k = codes.shape[:2]
        if n > DECODE_BATCH:  # the decoder's activations grow with the batch: thousands of frames at once take GBs
            part = lambda x, s: x if x is None or len(x) != n else x[s : s + DECODE_BATCH]  # noqa: E731
            return np.concatenate([self.decode_rollout(codes[s : s + DECODE_BATCH], start[s : s + DECODE_BATCH],
                                                       part(first, s), part(before, s), part(actions, s))
                                   for s in range(0, n, DECODE_BATCH)])
        if self.refiner is None and self.context_frame == "first":
            context = np.repeat(np.asarray(first), k, 0) if len(first) == n else first
            return self.decode(codes.reshape(n * k, -1), context).reshape(n, k, *start.shape[1:])
        if self.refiner is not None:
            if before is None or actions is None:
                raise ValueError("this world model refines its frames by motion: decode_rollout needs `before` (the "
                                 "real frame before `start`) and `actions` (N, k, 7)")
            actions = np.asarray(actions, dtype=np.float32)
            if actions.shape[:2] != (n, k):
                raise ValueError(f"expected one action per predicted frame, shape ({n}, {k}, 7), got {actions.shape}")
        frames, last = [], start
        for j in range(k):
            frame = self.decode(codes[:, j], first if self.context_frame == "first" else last)
            if self.refiner is not None:
                frame = self.refine(np.asarray(before), np.asarray(last), frame, actions[:, j])
                before = last
            frames.append(frame)
            last = frame
        return np.stack(frames, 1)

    # ------------------------------------------------------------------------------------------ prompts

    def prompt(self, past_codes, past_flags, past_actions) -> list[int]:
        """BOS + the last `context_steps` steps; the last action is the one whose outcome is predicted."""
        n = self.settings.context_steps
        return V.window_tokens(past_codes[-n:], past_flags[-n:], past_actions[-n:])

    def slide(self, prompt: list[int], codes, flag: bool, action) -> list[int]:
        """The next prompt: `prompt` with the predicted frame, its flag and the next action appended, cut back to
        the last `context_steps` steps (the window slides, as in RLVR-World)."""
        keep = self.settings.context_steps * self.step_tokens
        return [V.BOS] + (list(prompt[1:]) + V.step_tokens(codes, flag, action))[-keep:]

    def predict(
        self,
        prompts: list[list[int]],
        k: int = 1,
        future_actions: list | None = None,
        sampling: SamplingConfig | None = None,
        num_samples: int = 1,
        generator: torch.Generator | None = None,
    ) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
        """The codes, success probabilities and errors of `rollout` without frames: for k > 1 only a model whose
        prompts take the generated codes (`context_from_frames` False) can roll out without decoding."""
        result = self.rollout(prompts, None, k, future_actions, sampling, num_samples, generator)
        return result.codes, result.success, result.errors

    @torch.no_grad()
    def rollout(
        self,
        prompts: list[list[int]],
        start: RolloutStart | None,
        k: int = 1,
        future_actions: list | None = None,
        sampling: SamplingConfig | None = None,
        num_samples: int = 1,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        """Roll k frames forward from each prompt under the given actions (k-1 per prompt after the prompt's own).

        One frame at a time: each predicted frame, its predicted flag and the next real action join the prompt and
        the oldest step leaves it, exactly as the learned env steps, so a rollout never sees a longer context than
        the model was trained on. With `start` each frame is decoded (and refined) as it comes, and with
        `context_from_frames` it joins the prompt as the codes of that frame. Rows are prompt-major (prompt i's
        samples are rows i*num_samples ...). An unparsable frame (the layout mask makes it unreachable for a sane
        model) leaves its row's codes -1 from there on; the row goes on from its last frame repeated.
        """
        if k > 1 and (future_actions is None or len(future_actions) != len(prompts)):
            raise ValueError(f"a {k}-step rollout needs {k - 1} future actions for each of the {len(prompts)} prompts")
        if start is None and k > 1 and self.settings.context_from_frames:
            raise ValueError("this world model feeds its decoded frames back into the prompt (context_from_frames): "
                             "a rollout of more than one frame needs a RolloutStart to decode them from")
        if start is not None and len(start.last) != len(prompts):
            raise ValueError(f"expected a RolloutStart row per prompt ({len(prompts)}), got {len(start.last)}")
        sampling = sampling or SamplingConfig(temperature=0.0)
        sampling = SamplingConfig(V.rollout_length(1, self.frame_tokens), sampling.temperature, sampling.top_k,
                                  sampling.top_p, ())
        allowed = V.rollout_allowed_tokens(1, self.frame_tokens)
        rows = len(prompts) * num_samples
        codes = np.full((rows, k, self.frame_tokens), -1, dtype=np.int64)
        context = np.zeros_like(codes)
        success = np.zeros((rows, k), dtype=np.float32)
        uncertainty = np.zeros((rows, k), dtype=np.float32)
        errors: list[str | None] = [None] * rows
        frames = None
        if start is not None:
            start = start.rows(np.arange(rows) // num_samples)
            frames = np.zeros((rows, k, *start.last.shape[1:]), dtype=np.uint8)
            last, before = start.last, start.before
        current = [list(prompts[i // num_samples]) for i in range(rows)]
        for step in range(k):
            generated = sample(
                self.lm, current if step else list(prompts), sampling, num_samples=num_samples if step == 0 else 1,
                pad_token_id=V.PAD, generator=generator, track_token_ids=(V.FLAG_RUNNING, V.FLAG_SUCCESS),
                allowed_tokens=allowed, track_logprobs=True, matmul_dtype=self.matmul_dtype,
            )
            uncertainty[:, step] = (-generated.token_logprobs[:, : self.frame_tokens].mean(-1)).cpu().numpy()
            tracked = generated.tracked_probs[:, self.frame_tokens]  # the flag's (rows, 2)
            success[:, step] = (tracked[:, 1] / tracked.sum(-1).clamp(min=1e-9)).cpu().numpy()
            flags = np.zeros(rows, dtype=bool)
            for i, completion in enumerate(generated.completions()):
                parsed, parsed_flags, error = V.parse_rollout(completion, 1, self.frame_tokens)
                if errors[i] is None and error is not None:
                    errors[i] = f"frame {step}: {error}" if k > 1 else error
                if errors[i] is None:
                    codes[i, step], flags[i] = parsed[0], bool(parsed_flags[0])
                    context[i, step] = parsed[0]
                else:  # repeat the last frame
                    context[i, step] = current[i][-self.step_tokens :][: self.frame_tokens]
            if start is not None:
                reference = start.first if self.context_frame == "first" else last
                frame = self.decode(context[:, step], reference)
                if self.refiner is not None:
                    action = start.action if step == 0 else np.stack([future_actions[i // num_samples][step - 1] for i in range(rows)])
                    frame = self.refine(before, last, frame, action)
                frames[:, step] = frame
                if self.settings.context_from_frames:
                    context[:, step] = self.encode(frame, reference)
                before, last = last, frame
            if step < k - 1:
                current = [self.slide(current[i], context[i, step], flags[i], future_actions[i // num_samples][step])
                           for i in range(rows)]
        return Rollout(codes, success, errors, frames, context, uncertainty)


def predict_in_batches(world: RobotWorldModel, prompts, start: RolloutStart, k: int, future,
                       sampling: SamplingConfig | None = None, num_samples: int = 1, batch: int = 64,
                       seed: int = 0) -> Rollout:
    """`world.rollout` over the prompts in batches of `batch`, concatenated."""
    parts = []
    for s in range(0, len(prompts), batch):
        parts.append(world.rollout(prompts[s : s + batch], start.rows(slice(s, s + batch)), k,
                                   future[s : s + batch] if future else None, sampling, num_samples,
                                   torch.Generator().manual_seed(seed + s)))
    return Rollout.concatenate(parts)
