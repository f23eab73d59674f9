"""State dynamics: an ensemble of MLPs that steps the tabletop's true state (gripper, objects, drawer) under actions.

The video world model's frames lose what a large move does: the gripper smears within a step or two and the drawer is
not shown closing, so success read off its frames misses most true successes (the state reader gets 0.97 balanced
accuracy on real frames and 0.53 on imagined ones). The state it would have to read is low-dimensional, and the
palm follows the action almost exactly: a model in that space, fit on the same real episodes, keeps track of where
the gripper is and what it pushes. Success is the task's own test (`envs.robot.tasks.success_margin`) on the state
it predicts; the members' disagreement says where it is guessing (PETS, MBPO).

Each member maps (standardized state, action, previous action) to the state's change in units of the training
changes' spread; the previous action stands in for the velocities the state leaves out. Predicted states are clipped
to the range seen in training, so that an open-loop rollout cannot drift where no real state was.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from envs.robot.policies import reach_point
from envs.robot.tasks import Task, success_margin
from rlvr_gym.data.episodes import ACTION_DIM, STATE_NAMES
from rlvr_gym.models.state_reader import margin_probability

STATE_DIM = len(STATE_NAMES)
OBJECTS = slice(STATE_NAMES.index("object0_x"), STATE_NAMES.index("object2_z") + 1)
DRAWER = STATE_NAMES.index("drawer_qpos")
GRIPPER = slice(STATE_NAMES.index("gripper_x"), STATE_NAMES.index("gripper_z") + 1)


def dynamics_margin(task: Task, states: np.ndarray, target_xy: np.ndarray) -> np.ndarray:
    """The task's success margin (m, > 0 succeeded) on states (N, len(STATE_NAMES)), the target marker's centre
    (2,) or (N, 2)."""
    states = np.asarray(states, dtype=np.float64)
    target = np.broadcast_to(np.asarray(target_xy, dtype=np.float64), (len(states), 2))
    return success_margin(task, states[:, OBJECTS].reshape(-1, 3, 3), states[:, DRAWER], target)


def dynamics_reach_distance(task: Task, states: np.ndarray, target_xy: np.ndarray) -> np.ndarray:
    """Distance (m) from the palm to where the task's work starts (`envs.robot.policies.reach_point`) on states
    (N, len(STATE_NAMES)), the target marker's centre (2,) or (N, 2)."""
    states = np.asarray(states, dtype=np.float64)
    target = np.broadcast_to(np.asarray(target_xy, dtype=np.float64), (len(states), 2))
    point = reach_point(task, states[:, OBJECTS].reshape(-1, 3, 3), states[:, DRAWER], target)
    return np.linalg.norm(states[:, GRIPPER] - point, axis=-1)


def dynamics_success_probability(task: Task, states: np.ndarray, target_xy: np.ndarray) -> np.ndarray:
    """`margin_probability` of the predicted states' success margin, as a state reader's."""
    return margin_probability(dynamics_margin(task, states, target_xy))


class StateDynamicsConfig(PretrainedConfig):
    model_type = "rlvr_state_dynamics"

    def __init__(self, members: int = 5, hidden: int = 256, layers: int = 3, mean: list[float] | None = None,
                 std: list[float] | None = None, delta_std: list[float] | None = None, low: list[float] | None = None,
                 high: list[float] | None = None, **kwargs):
        if members < 1 or hidden < 1 or layers < 1:
            raise ValueError(f"members, hidden and layers must be >= 1, got {members}, {hidden}, {layers}")
        self.members = members
        self.hidden = hidden
        self.layers = layers
        # From the training transitions: inputs are standardized by mean/std, outputs are changes in delta_std
        # units, and predicted states are clipped to [low, high].
        self.mean = list(mean) if mean is not None else [0.0] * STATE_DIM
        self.std = list(std) if std is not None else [1.0] * STATE_DIM
        self.delta_std = list(delta_std) if delta_std is not None else [1.0] * STATE_DIM
        self.low = list(low) if low is not None else [-1e3] * STATE_DIM
        self.high = list(high) if high is not None else [1e3] * STATE_DIM
        for name in ("mean", "std", "delta_std", "low", "high"):
            if len(getattr(self, name)) != STATE_DIM:
                raise ValueError(f"{name} needs one value per state column {STATE_NAMES}, got {len(getattr(self, name))}")
        super().__init__(**kwargs)


def _member(config: StateDynamicsConfig) -> nn.Sequential:
    sizes = [STATE_DIM + 2 * ACTION_DIM] + [config.hidden] * config.layers
    layers: list[nn.Module] = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.SiLU()]
    return nn.Sequential(*layers, nn.Linear(sizes[-1], STATE_DIM))


class StateDynamics(PreTrainedModel):
    config_class = StateDynamicsConfig
    main_input_name = "states"

    def __init__(self, config: StateDynamicsConfig):
        super().__init__(config)
        self.members = nn.ModuleList([_member(config) for _ in range(config.members)])
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):  # PyTorch's defaults
            module.reset_parameters()

    def _scale(self, name: str) -> torch.Tensor:
        return torch.tensor(getattr(self.config, name), dtype=torch.float32, device=self.device)

    def forward(self, states: torch.Tensor, actions: torch.Tensor, prev_actions: torch.Tensor) -> torch.Tensor:
        """States (N, STATE_DIM) in metres, actions and the actions before them (N, 7) -> each member's predicted
        change in delta_std units (members, N, STATE_DIM). Inputs with a leading members axis (members, N, ...)
        give member m its own rows m (bootstrapped training batches)."""
        x = torch.cat([(states - self._scale("mean")) / self._scale("std"), actions, prev_actions], -1)
        if x.dim() == 3:
            return torch.stack([member(rows) for member, rows in zip(self.members, x, strict=True)])
        return torch.stack([member(x) for member in self.members])

    def target(self, states: torch.Tensor, next_states: torch.Tensor) -> torch.Tensor:
        """The change `forward` is trained to predict, in delta_std units."""
        return (next_states - states) / self._scale("delta_std")

    @torch.no_grad()
    def step(self, states: np.ndarray, actions: np.ndarray, prev_actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The next states (N, STATE_DIM), the members' mean clipped to the training range, and their disagreement
        (N,): the largest standard deviation across members of any column, in delta_std units."""
        states, actions, prev_actions = (np.asarray(x, dtype=np.float32) for x in (states, actions, prev_actions))
        if states.ndim != 2 or states.shape[1] != STATE_DIM:
            raise ValueError(f"expected states of shape (N, {STATE_DIM}) ({', '.join(STATE_NAMES)}), got {states.shape}")
        if actions.shape != (len(states), ACTION_DIM) or prev_actions.shape != actions.shape:
            raise ValueError(f"expected actions and previous actions of shape ({len(states)}, {ACTION_DIM}), got "
                             f"{actions.shape} and {prev_actions.shape}")
        as_tensor = lambda x: torch.as_tensor(x, device=self.device)  # noqa: E731
        changes = self(as_tensor(states), as_tensor(actions), as_tensor(prev_actions)).float()
        mean = as_tensor(states) + changes.mean(0) * self._scale("delta_std")
        mean = torch.minimum(torch.maximum(mean, self._scale("low")), self._scale("high"))
        spread = changes.std(0).amax(-1) if len(self.members) > 1 else torch.zeros(len(states), device=self.device)
        return mean.cpu().numpy(), spread.cpu().numpy()

    def rollout(self, first_states: np.ndarray, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Open loop from first states (N, STATE_DIM) under actions (N, T, 7): states (N, T + 1, STATE_DIM) and
        the disagreement of each step (N, T)."""
        actions = np.asarray(actions, dtype=np.float32)
        states, spreads = [np.asarray(first_states, dtype=np.float32)], []
        prev = np.zeros((len(states[0]), ACTION_DIM), np.float32)
        for t in range(actions.shape[1]):
            state, spread = self.step(states[-1], actions[:, t], prev)
            states.append(state)
            spreads.append(spread)
            prev = actions[:, t]
        return np.stack(states, 1), np.stack(spreads, 1) if spreads else np.zeros((len(states[0]), 0), np.float32)
