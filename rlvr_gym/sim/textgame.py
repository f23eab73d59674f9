"""The learned text-game simulator: a text world model stepped from real TextWorld start states, as a Gymnasium env,
and a wrapper that gives SB3 a Discrete action over the state's commands and a fixed-size observation.
(Longer than 500 lines: the start states, the batched simulator core, the env and its SB3 wrapper are one contract.)

A text world-model checkpoint directory (a Hugging Face causal LM with its tokenizer, see `rlvr_gym.models.lm`) also
holds the start states the simulator resets to, written by `write_start_states`:
    textworld_start_states.json   {"textworld_version", "start_states": [{"seed", "nb_rooms", "nb_objects",
                                   "quest_length", "objective", "state", "walkthrough", "max_score"}, ...]}
Each is the real initial state of a TextWorld game generated from held-out seeds (no training collection uses
them), in the ByteSized32 object schema; the game itself is regenerated from its seed to play the same start for
real (`open_real_game`).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import string
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gymnasium as gym
import numpy as np

from rlvr_gym.data.real_env_versions import check_real_env_versions, write_real_env_versions
from rlvr_gym.data.textgame import encode_texts
from rlvr_gym.domains.textgame import State, format_prompt, parse_diff, rebuild, states_match, wins
from rlvr_gym.models.lm import CheckpointError, checked_tokenizer, context_length, load_model, resolve_checkpoint
from rlvr_gym.models.sampler import sample_scored_texts, sample_texts
from rlvr_gym.sim.discrete import action_mask, stable_bucket
from rlvr_gym.sim.guard import Guard
from rlvr_gym.sim.vector import reset_arguments

if TYPE_CHECKING:
    from envs.textworld import TextWorldGame

log = logging.getLogger("rlvr_gym")

START_STATES = "textworld_start_states.json"
DEFAULT_CHECKPOINT = "textgame-rlvr"
HELD_OUT_SEED = 1_000_000
"""First seed of the start-state games; `collect textworld` trains on seeds from 0, far below."""
DEFAULT_MAX_STEPS = 30
DEFAULT_MAX_NEW_TOKENS = 256
"""TextWorld diffs are at most ~43 tokens of the ByteSized32 BPE (ByteSized32's ~136); the room is for a `--model` that
tokenizes more finely. Longer completions are cut and fail to parse."""
NOOP_COMMAND = "look"
"""TextWorld's command that changes nothing; the discrete wrappers send it when a state offers no command."""
MAX_OBSERVATION_CHARS = 8192
MAX_COMMAND_CHARS = 256
CHARSET = frozenset(string.ascii_letters + string.digits + string.punctuation + " \n")
DEFAULT_MAX_CANDIDATES = 32
DEFAULT_OBS_DIM = 1024

_ID_SUFFIX = re.compile(r"^(.*) \(ID: -?\d+\)$", re.DOTALL)
_DIRECTIONS = ("north", "south", "east", "west")


# ---------------------------------------------------------------------------------------------------- start states


@dataclass(frozen=True)
class StartState:
    """The real initial state of a generated TextWorld game, and what regenerates the game."""

    seed: int
    """TextWorld generation seed."""
    nb_rooms: int
    nb_objects: int
    quest_length: int
    objective: str
    """The game's objective text."""
    state: dict[str, Any]
    """Initial state in the ByteSized32 schema (`envs.textworld.state_from_facts`)."""
    walkthrough: list[str]
    """The real game's winning command sequence from this state."""
    max_score: float


def write_start_states(
    checkpoint_dir: str | os.PathLike,
    seeds: Sequence[int] = range(HELD_OUT_SEED, HELD_OUT_SEED + 32),
    nb_rooms: int = 3,
    nb_objects: int = 5,
    quest_length: int = 3,
    game_dir: str | os.PathLike | None = None,
) -> Path:
    """Generate a TextWorld game per seed, record its real initial state, objective, walkthrough and generation
    arguments in CHECKPOINT_DIR/textworld_start_states.json; returns the file.

    Use seeds no training collection used (the default range starts at 1,000,000). A game whose entities share a name
    has no state in the object schema and is skipped with a warning. Games are compiled into `game_dir` (default:
    `envs.textworld.DEFAULT_GAME_DIR`), a cache that `open_real_game` reuses.
    """
    import textworld

    from envs.textworld import DEFAULT_GAME_DIR, TextWorldGame, make_game

    if not seeds:
        raise ValueError("write_start_states needs at least one seed")
    game_dir = Path(game_dir or DEFAULT_GAME_DIR)
    starts = []
    for seed in seeds:
        game = TextWorldGame(make_game(seed, game_dir, nb_rooms, nb_objects, quest_length))
        try:
            state = game.reset()
            starts.append(StartState(int(seed), nb_rooms, nb_objects, quest_length, game.objective, state,
                                     game.policy_commands, game.max_score))
        except ValueError as error:
            log.warning("skipping TextWorld game of seed %d: %s", seed, error)
        finally:
            game.close()
    if not starts:
        raise ValueError(f"no game of seeds {list(seeds)} has a state in the object schema; try other seeds")
    path = Path(checkpoint_dir) / START_STATES
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"textworld_version": textworld.__version__, "start_states": [asdict(s) for s in starts]}))
    os.replace(tmp, path)
    write_real_env_versions(checkpoint_dir, "textgame")
    return path


def load_start_states(checkpoint: str | os.PathLike) -> list[StartState]:
    """The start states shipped with a checkpoint (a shipped name or a directory), checked for their fields."""
    path = resolve_checkpoint(checkpoint) / START_STATES
    if not path.is_file():
        raise CheckpointError(
            f"{path.parent} has no {START_STATES}, so the simulator has no real states to start from; write them with "
            "rlvr_gym.sim.textgame.write_start_states(checkpoint_dir)"
        )
    try:
        records = json.loads(path.read_text())["start_states"]
        starts = [StartState(**r) for r in records]
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{path} is corrupt ({type(error).__name__}: {error}); write it again with write_start_states") from None
    if not starts:
        raise CheckpointError(f"{path} lists no start states; write it again with write_start_states")
    for i, s in enumerate(starts):
        objects = s.state.get("objects") if isinstance(s.state, dict) else None
        if not isinstance(objects, list) or not objects or not all(_is_object(o) for o in objects) \
                or any(f not in s.state for f in ("score", "gameOver", "gameWon")):
            raise CheckpointError(f"{path}: start state {i} is not a state in the object schema; write it again with write_start_states")
    check_real_env_versions(path.parent, "textgame")
    return starts


def open_real_game(start: StartState, game_dir: str | os.PathLike | None = None) -> TextWorldGame:
    """The real TextWorld game of a start state, regenerated from its seed (cached in `game_dir`), reset, and
    checked to start where the recorded state does."""
    from envs.textworld import DEFAULT_GAME_DIR, TextWorldGame, make_game

    path = make_game(start.seed, Path(game_dir or DEFAULT_GAME_DIR), start.nb_rooms, start.nb_objects, start.quest_length)
    game = TextWorldGame(path)
    state = game.reset()
    if not states_match(state, start.state) or game.objective != start.objective:
        game.close()
        raise RuntimeError(
            f"TextWorld generated another game for seed {start.seed} than the one the start states record "
            f"({path}); delete that file if it is stale, or write the start states again with this TextWorld version"
        )
    return game


# ---------------------------------------------------------------------------------------------------- commands and views


def candidate_commands(state: State) -> list[str]:
    """TextWorld's commands that apply in a state, built from its objects: go, examine, take (from), drop, put on,
    insert into, open, close, lock / unlock with a matching key, eat, and inventory and look; sorted.

    On real TextWorld states these are the game's admissible commands. On predicted states the rules read what
    the objects say (where the agent is, what is open, which key unlocks what); a state without an agent in a room
    offers only inventory and look.
    """
    objects = state["objects"]
    by_name = {o["name"]: o for o in objects}
    commands = {"inventory", NOOP_COMMAND}
    agent = next((o for o in objects if o["type"] == "Agent"), None)
    rooms = [o for o in objects if o["type"] == "Room" and agent is not None and agent["name"] in o["contains"]]
    if not rooms:
        return sorted(commands)

    def contents(o: dict) -> list[dict]:
        return [by_name[n] for n in o["contains"] if isinstance(n, str) and n in by_name]

    room, inventory = rooms[0], contents(agent)
    exits = room["properties"].get("connects")
    doors = [o for o in objects if o["type"] == "Door" and room["name"] in _linked_rooms(o)]
    for direction, target in (exits.items() if isinstance(exits, dict) else ()):
        if direction not in _DIRECTIONS or not isinstance(target, str):
            continue
        if not any(set(_linked_rooms(d)) == {room["name"], target} and d["properties"].get("isOpen") is not True for d in doors):
            commands.add(f"go {direction}")
    for thing in [o for o in contents(room) if o is not agent] + doors:
        name, props = _label(thing), thing["properties"]
        commands.add(f"examine {name}")
        if props.get("isMoveable") is True and thing["type"] != "Door":
            commands.add(f"take {name}")
        if props.get("isOpenable") is True:
            commands |= _lock_commands(thing, inventory)
        holder = thing["type"] in ("Container", "Supporter") and props.get("isOpen") is not False
        if holder:
            for item in contents(thing):
                commands |= {f"examine {_label(item)}", f"take {_label(item)} from {name}"}
            verb = "put {} on" if thing["type"] == "Supporter" else "insert {} into"
            commands |= {f"{verb.format(_label(item))} {name}" for item in inventory}
    for item in inventory:
        commands |= {f"examine {_label(item)}", f"drop {_label(item)}"}
        if item["type"] == "Food":
            commands.add(f"eat {_label(item)}")
    return sorted(commands)


def render_state(state: State, objective: str) -> str:
    """The state as text: the objective, the score fields, then one line per object (type, properties, contents)."""
    lines = [
        f"Objective: {objective}",
        f"Score: {_compact(state['score'])}  gameOver: {_compact(state['gameOver'])}  gameWon: {_compact(state['gameWon'])}",
    ]
    for o in state["objects"]:
        line = " ".join([f"{o['name']} [{o['type']}]"] + [f"{k}={_compact(v)}" for k, v in o["properties"].items()])
        if o["contains"]:
            line += " contains: " + ", ".join(map(str, o["contains"]))
        lines.append(line)
    return to_text_space("\n".join(lines), MAX_OBSERVATION_CHARS)


def to_text_space(text: str, max_length: int) -> str:
    """`text` as a member of a `Text(max_length, charset=CHARSET)` space: other characters become '?', and a text
    that is too long is cut with a final '...'."""
    text = "".join(c if c in CHARSET else "?" for c in text)
    return text if len(text) <= max_length else text[: max_length - 3] + "..."


def observation_features(state: State, objective: str) -> set[str]:
    """What the discrete observation hashes: each object's type, property values and contents, the score fields,
    and the objective's words."""
    features = {f"s:{f}={_compact(state[f])}" for f in ("score", "gameOver", "gameWon")}
    features |= {f"w:{w}" for w in re.findall(r"[a-z0-9]+", objective.lower())}
    for o in state["objects"]:
        name = _label(o)
        features.add(f"o:{name}:{o['type']}")
        features |= {f"p:{name}:{k}={_compact(v)}" for k, v in o["properties"].items()}
        features |= {f"c:{name}:{_label_text(str(c))}" for c in o["contains"]}
    return features


COMMAND_VERBS = ("go", "take", "drop", "put", "insert", "open", "close", "lock", "unlock", "eat", "examine",
                 "inventory", "look")
"""The first words of `candidate_commands`: one feature each in a candidate slot."""
SLOT_FEATURES = 1 + len(COMMAND_VERBS) + 3
"""Per action slot: a first entry of the candidate list (not a wrapped-around repeat), the verb (one-hot), the share of
the command's other words found in the objective, where in the objective the first of them appears (1 when none
does), and whether the command was sent before in the episode (a policy that only sees the state cannot tell a
loop from progress)."""
_FILLER_WORDS = frozenset({"from", "on", "into", "with", "the", "a", "an"})


def command_features(command: str, objective_words: Sequence[str], sent: bool = False) -> np.ndarray:
    """A candidate slot's features (SLOT_FEATURES): what a policy needs to tell commands apart across games, where
    the same index names different commands: the verb, and how the command's words meet the objective's."""
    words = command.lower().split()
    x = np.zeros(SLOT_FEATURES, dtype=np.float32)
    x[0] = 1.0
    if words and words[0] in COMMAND_VERBS:
        x[1 + COMMAND_VERBS.index(words[0])] = 1.0
    content = [w for w in words[1:] if w not in _FILLER_WORDS]
    found = [objective_words.index(w) for w in content if w in objective_words]
    x[-3] = len(found) / len(content) if content else 0.0
    x[-2] = min(found) / max(len(objective_words), 1) if found else 1.0
    x[-1] = float(sent)
    return x


def encode_observation(
    state: State,
    objective: str,
    candidates: Sequence[str],
    step_fraction: float,
    obs_dim: int = DEFAULT_OBS_DIM,
    max_candidates: int = DEFAULT_MAX_CANDIDATES,
    sent: Collection[str] = (),
) -> np.ndarray:
    """The discrete wrappers' float32 observation of length `obs_dim`, values in [0, 1]:
    `[0, obs_dim - max_candidates * SLOT_FEATURES - 1)` a hashed set of `observation_features` (CRC32, stable across
    processes), then for each action index the `command_features` of the command it sends (`command_for`: past the
    end of the list, the list wraps around and the slot's first feature is 0; `sent`: the commands sent so far this
    episode), then the fraction of max_steps done."""
    bag = obs_dim - max_candidates * SLOT_FEATURES - 1
    x = np.zeros(obs_dim, dtype=np.float32)
    for feature in observation_features(state, objective):
        x[stable_bucket(feature, bag)] = 1.0
    objective_words = re.findall(r"[a-z0-9]+", objective.lower())
    for i in range(max_candidates if candidates else 0):
        slot = x[bag + i * SLOT_FEATURES : bag + (i + 1) * SLOT_FEATURES]
        command = candidates[i % len(candidates)]
        slot[:] = command_features(command, objective_words, command in sent)
        slot[0] = float(i < len(candidates))
    x[-1] = min(max(step_fraction, 0.0), 1.0)
    return x


def command_for(action: Any, candidates: Sequence[str], action_space: gym.spaces.Discrete) -> str:
    """The command a discrete action names: candidate `action`, wrapping around past the end of the list (so every
    action names an applicable command, and a uniform policy plays the candidates near uniformly, not mostly one
    no-op); NOOP_COMMAND ("look") when there is no candidate."""
    if not action_space.contains(action):
        raise ValueError(f"action must be an int in [0, {action_space.n}), got {action!r}")
    return candidates[int(action) % len(candidates)] if candidates else NOOP_COMMAND


def discrete_spaces(max_candidates: int, obs_dim: int) -> tuple[gym.spaces.Box, gym.spaces.Discrete]:
    if max_candidates < 1 or obs_dim < max_candidates * SLOT_FEATURES + 2:
        raise ValueError(f"need max_candidates >= 1 and obs_dim >= max_candidates * {SLOT_FEATURES} + 2 (the candidate "
                         f"slots and room for hashed features), got max_candidates={max_candidates}, obs_dim={obs_dim}")
    return gym.spaces.Box(0.0, 1.0, (obs_dim,), np.float32), gym.spaces.Discrete(max_candidates)


def draw_start(rng: np.random.Generator, n: int, index: int | None) -> tuple[int, int]:
    """(start index, sampling seed) of a reset: `index` when given, else drawn; the real and learned envs draw the
    same way, so the same reset seed starts both from the same state."""
    if index is None:
        index = int(rng.integers(n))
    elif not isinstance(index, (int, np.integer)) or not 0 <= index < n:
        raise ValueError(f"options['index'] must be an int in [0, {n}), got {index!r}")
    # Drawn even when greedy, so that the sequence of start states a seed gives never depends on the temperature.
    return int(index), int(rng.integers(2**32))


def _is_object(o: Any) -> bool:
    types = {"name": str, "uuid": int, "type": str, "properties": dict, "contains": list}
    return isinstance(o, dict) and all(isinstance(o.get(k), t) for k, t in types.items())


def _linked_rooms(door: dict) -> list:
    rooms = door["properties"].get("connects")
    return rooms if isinstance(rooms, list) and all(isinstance(r, str) for r in rooms) else []


def _lock_commands(thing: dict, inventory: list[dict]) -> set[str]:
    props, name = thing["properties"], _label(thing)
    keys = [_label(k) for k in inventory if k["properties"].get("unlocks") == thing["name"]]
    if props.get("isLocked") is True:
        return {f"unlock {name} with {k}" for k in keys}
    if props.get("isOpen") is True:
        return {f"close {name}"}
    return {f"open {name}"} | {f"lock {name} with {k}" for k in keys}


def _label(o: dict) -> str:
    return _label_text(o["name"])


def _label_text(name: str) -> str:
    """A name without its ` (ID: n)` suffix, as the game's commands write it."""
    match = _ID_SUFFIX.match(name)
    return match.group(1) if match else name


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


# ---------------------------------------------------------------------------------------------------- simulator core


@dataclass
class Rollout:
    """One episode in the learned simulator."""

    index: int
    """Row of the start state."""
    start: StartState
    state: dict[str, Any]
    """The current (predicted) state."""
    sample_seed: int
    steps: int = 0
    reward: float = 0.0
    """Score gained by the last step."""
    completion: str = ""
    """The model's raw output for the last step."""
    error: str | None = None
    """Why the last output could not be used (parse error, context overflow), or None."""
    uncertainty: float = 0.0
    """Surprisal (nats) of the least likely token the model wrote for the last step: how much of it was a guess."""
    halted: bool = False
    """The last step's uncertainty exceeded the simulator's `halt_uncertainty`: the episode ends there, unpaid."""

    @property
    def terminated(self) -> bool:
        """The predicted game ended (lost or won) on a usable, unhalted step."""
        return self.error is None and not self.halted and bool(self.state["gameOver"] or self.state["gameWon"])

    @property
    def won(self) -> bool:
        return self.terminated and bool(self.state["gameWon"])

    @property
    def ended(self) -> bool:
        """No further step: the game ended, the output was unusable, or the guard halted it."""
        return self.terminated or self.error is not None or self.halted


class TextGameSimulator:
    """A text world model and the start states shipped with it; `advance` steps any number of rollouts at once.

    The guard against an agent that drives the model where it guesses (all off by default): `uncertainty_penalty`
    (MOPO) takes that many points per nat of a step's `Rollout.uncertainty` off its reward; `halt_uncertainty`
    (MOReL) ends a rollout, unpaid and not won, at a step more uncertain than that; `win_check`, a second world model
    trained apart (other episodes, another seed), is asked about every step the first predicts to win, and where it
    does not predict the win the rollout ends there the same way. The check removes as many false wins as fall on
    steps where the second model does not err too: two refits trained on halves of the same random play shared most
    of theirs (README, Results).
    """

    def __init__(
        self,
        checkpoint: str | os.PathLike = DEFAULT_CHECKPOINT,
        temperature: float = 0.0,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        batch_size: int = 16,
        uncertainty_penalty: float = 0.0,
        halt_uncertainty: float | None = None,
        win_check: str | os.PathLike | None = None,
    ):
        if temperature < 0 or max_new_tokens < 1 or batch_size < 1:
            raise ValueError(f"need temperature >= 0 (0 = greedy), max_new_tokens >= 1 and batch_size >= 1, got "
                             f"{temperature}, {max_new_tokens}, {batch_size}")
        self.guard = Guard(uncertainty_penalty, halt_uncertainty)
        self.starts = load_start_states(checkpoint)
        self.model, tokenizer = load_model(checkpoint)
        self.tokenizer = checked_tokenizer(tokenizer, checkpoint)
        self.model.eval()
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.context = context_length(self.model)
        self.checker = None  # (model, tokenizer, context length) of the win_check model
        if win_check:
            checker, checker_tokenizer = load_model(win_check)
            self.checker = (checker.eval(), checked_tokenizer(checker_tokenizer, win_check), context_length(checker))

    def start(self, rng: np.random.Generator, index: int | None = None) -> Rollout:
        """A new rollout from start state `index`, or one drawn with `rng`."""
        index, sample_seed = draw_start(rng, len(self.starts), index)
        start = self.starts[index]
        return Rollout(index, start, start.state, sample_seed)

    def advance(self, rollouts: Sequence[Rollout], commands: Sequence[str], seed: int) -> None:
        """Predict every rollout's next state under its command in batched generation (sampling seeded by `seed`).

        A completion that does not parse, or a state too long for the model's context, leaves the state as it was
        and sets the rollout's `error`. A step more uncertain than `halt_uncertainty`, or a win the `win_check` model
        does not predict, takes the predicted state and sets `halted`: the rollout has ended, and the step pays nothing.
        """
        from envs.textworld import in_uuid_order  # the real games' listing; textworld loads only when stepping

        prompts = encode_texts(self.tokenizer, [format_prompt(r.state, c, r.start.objective)
                                                for r, c in zip(rollouts, commands)])
        fits = [len(p) + self.max_new_tokens <= self.context for p in prompts]
        outputs = iter(sample_scored_texts(self.model, self.tokenizer, [p for p, ok in zip(prompts, fits) if ok],
                                           self.batch_size, self.max_new_tokens, temperature=self.temperature,
                                           seed=seed)
                       if any(fits) else [])
        claimed_wins = []
        for r, command, prompt, ok in zip(rollouts, commands, prompts, fits):
            r.steps += 1
            r.reward, r.uncertainty, r.halted = 0.0, 0.0, False
            if not ok:
                r.completion = ""
                r.error = (f"the state no longer fits the model's context: {len(prompt)} prompt tokens + "
                           f"{self.max_new_tokens} new > {self.context}")
                continue
            r.completion, logprobs = next(outputs)
            r.uncertainty = float(-logprobs.min()) if len(logprobs) else 0.0
            r.halted = self.guard.halts(r.uncertainty)
            diff, r.error = parse_diff(r.completion, r.state)
            if diff is not None:
                # `rebuild` appends what a step adds to a container; left there, the next prompt would show the model
                # an order no real TextWorld state has
                next_state = in_uuid_order(rebuild(r.state, diff))
                gained = float(next_state["score"]) - float(r.state["score"])
                r.reward = (0.0 if r.halted else gained) - self.guard.penalty * r.uncertainty
                if self.checker is not None and not r.halted and wins(r.state, next_state):
                    claimed_wins.append((r, r.state, command))
                r.state = next_state
        if claimed_wins:
            self.check_wins(claimed_wins)

    def check_wins(self, claimed: Sequence[tuple[Rollout, dict[str, Any], str]]) -> None:
        """Halt, unpaid, each rollout whose winning step (from `before` under `command`) the checker, greedy, does
        not predict to win."""
        model, tokenizer, context = self.checker
        prompts = encode_texts(tokenizer, [format_prompt(before, command, r.start.objective)
                                           for r, before, command in claimed])
        fits = [len(p) + self.max_new_tokens <= context for p in prompts]
        asked = iter(sample_texts(model, tokenizer, [p for p, ok in zip(prompts, fits) if ok], self.batch_size,
                                  self.max_new_tokens) if any(fits) else [])
        for (r, before, _), ok in zip(claimed, fits):
            diff, error = parse_diff(next(asked)[0], before) if ok else (None, "too long for the checker")
            if error is not None or not wins(before, rebuild(before, diff)):
                r.halted = True
                r.reward = -self.guard.penalty * r.uncertainty


# ---------------------------------------------------------------------------------------------------- envs


class TextGameWorldEnv(gym.Env):
    """TextWorld games as a text world model predicts them, from real start states.

    ## Description
    Each step formats the current state and the command as the model's prompt (`format_prompt`), lets the model
    write the diff, and rebuilds the next state from it (`parse_diff`, `rebuild`). Nothing of TextWorld runs: the
    next state, score and game end all come from the model. Any command is sent to the model, an invalid one like
    any other: a model that learned TextWorld predicts "nothing happens" (the empty diff) for it.

    ## Action Space
    `Text(256)`: a command such as "go east" or "take key from table" (`info["candidates"]` lists those that apply
    in the current state). Characters outside the space's charset still reach the model; a non-string raises ValueError.

    ## Observation Space
    `Text(8192, charset=printable ASCII)`: the objective, the score fields and one line per object of the current
    state (`render_state`); other characters become '?', and a longer rendering is cut with '...'.

    ## Rewards
    The predicted score minus the previous score (less the uncertainty penalty, if set).

    ## Starting State
    The real initial state of a held-out TextWorld game from the checkpoint's `textworld_start_states.json`, drawn
    with the env's `np_random`; `reset(options={"index": i})` picks start state i.

    ## Episode End
    Terminated when the predicted state has gameOver or gameWon. Truncated after `max_steps` steps, and at once
    when the model's output cannot be parsed or the state outgrows the model's context (then `info["error"]` says
    why and the state stays as it was), or when the guard halts it; model output never raises.
    `info`: `state` (the predicted state), `candidates` (commands built from it, `candidate_commands`), `error`,
    `completion` (the raw output), `step`, `start_index`, `game_seed` (regenerates the real game), `objective`,
    `is_success` (predicted gameWon, not halted), `uncertainty` (the surprisal, in nats, of the least likely token
    the model wrote for the step) and `halted`.

    ## Arguments
    - `checkpoint`: a shipped name or a Hugging Face directory with its tokenizer and start states (default "textgame-rlvr").
    - `max_steps`: steps before truncation (default 30).
    - `temperature`: 0 for greedy predictions; > 0 samples them, seeded from `np_random` at reset, so the same
      reset seed gives the same rollout.
    - `max_new_tokens`: completion length limit; a longer diff is cut and fails to parse.
    - `render_mode`: None or "ansi"; `render()` returns the observation text.
    - `uncertainty_penalty` (MOPO, default 0: off): the reward less this times `info["uncertainty"]`.
    - `halt_uncertainty` (MOReL, default None: off): a step whose `info["uncertainty"]` exceeds it ends the episode,
      truncated, unpaid and not won, with `info["halted"]` True: the agent has driven the model where it guesses.
    - `win_check` (default None: off): a second world model (a directory or shipped name) trained apart; a step the
      first predicts to win ends the same way unless the second predicts the win too.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        checkpoint: str | os.PathLike = DEFAULT_CHECKPOINT,
        max_steps: int = DEFAULT_MAX_STEPS,
        temperature: float = 0.0,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        render_mode: str | None = None,
        uncertainty_penalty: float = 0.0,
        halt_uncertainty: float | None = None,
        win_check: str | os.PathLike | None = None,
    ):
        if max_steps < 1:
            raise ValueError(f"max_steps must be a positive number of steps, got {max_steps}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.sim = TextGameSimulator(checkpoint, temperature, max_new_tokens, batch_size=1,
                                     uncertainty_penalty=uncertainty_penalty, halt_uncertainty=halt_uncertainty,
                                     win_check=win_check)
        self.max_steps = max_steps
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Text(MAX_OBSERVATION_CHARS, min_length=0, charset=CHARSET)
        self.action_space = gym.spaces.Text(MAX_COMMAND_CHARS, min_length=0, charset=CHARSET)
        self._rollout: Rollout | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._rollout = self.sim.start(self.np_random, (options or {}).get("index"))
        return self._observation(), self._info()

    def step(self, command: str):
        if self._rollout is None:
            raise RuntimeError("call reset() before step()")
        if not isinstance(command, str):
            raise ValueError(f"the action is a command string such as 'go east', got {type(command).__name__} {command!r}")
        r = self._rollout
        self.sim.advance([r], [command], seed=r.sample_seed + r.steps)
        truncated = not r.terminated and (r.ended or r.steps >= self.max_steps)
        return self._observation(), r.reward, r.terminated, truncated, self._info()

    def render(self) -> str | None:
        if self.render_mode is None:
            gym.logger.warn("render() called without a render_mode: make the env with render_mode='ansi'")
            return None
        return self._observation() if self._rollout is not None else ""

    @property
    def rollout(self) -> Rollout | None:
        """The current episode."""
        return self._rollout

    def _observation(self) -> str:
        return render_state(self._rollout.state, self._rollout.start.objective)

    def _info(self) -> dict[str, Any]:
        r = self._rollout
        return {
            "state": copy.deepcopy(r.state),
            "candidates": candidate_commands(r.state),
            "error": r.error,
            "completion": r.completion,
            "step": r.steps,
            "start_index": r.index,
            "game_seed": r.start.seed,
            "objective": r.start.objective,
            "is_success": r.won,
            "uncertainty": r.uncertainty,
            "halted": r.halted,
        }


class TextGameDiscreteEnv(gym.Wrapper):
    """A TextGameWorldEnv for SB3: a Discrete action over the current candidate commands, a fixed-size Box observation.

    ## Action Space
    `Discrete(max_candidates)`: action i sends `info["candidates"][i]` (sorted; a state with more candidates than
    max_candidates loses the last ones). An index past the end of the list wraps around (`command_for`), so every
    action is legal; `action_masks()` marks the indices below the list's length, for MaskablePPO.

    ## Observation Space
    `Box(0, 1, (obs_dim,), float32)` from `encode_observation`: a hashed set of the state's (object, property,
    value) and (object, content) features and the objective's words; per action index, the command it sends: its
    verb, how its words meet the objective's and whether it was sent before in the episode (`command_features`);
    and the fraction of max_steps done.

    Rewards, episode end and `info` are the wrapped env's; `info["command"]` is the command an action sent.
    """

    def __init__(self, env: gym.Env, max_candidates: int = DEFAULT_MAX_CANDIDATES, obs_dim: int = DEFAULT_OBS_DIM):
        super().__init__(env)
        self.observation_space, self.action_space = discrete_spaces(max_candidates, obs_dim)
        self.max_candidates = max_candidates
        self.obs_dim = obs_dim
        self._info: dict[str, Any] = {}
        self._sent: set[str] = set()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        _, self._info = self.env.reset(seed=seed, options=options)
        self._sent = set()
        return self._encode(), self._info

    def step(self, action):
        if not self._info:
            raise RuntimeError("call reset() before step()")
        command = command_for(action, self._info["candidates"], self.action_space)
        _, reward, terminated, truncated, self._info = self.env.step(command)
        self._sent.add(command)
        return self._encode(), float(reward), terminated, truncated, {**self._info, "command": command}

    def action_masks(self) -> np.ndarray:
        return action_mask(self._info.get("candidates", []), self.max_candidates)

    def _encode(self) -> np.ndarray:
        i = self._info
        return encode_observation(i["state"], i["objective"], i["candidates"], i["step"] / self.get_wrapper_attr("max_steps"),
                                  self.obs_dim, self.max_candidates, self._sent)


class TextGameDiscreteVectorEnv(gym.vector.VectorEnv):
    """`num_envs` TextGameDiscreteEnv(TextGameWorldEnv) sharing one model, stepped with one batched generation.

    Spaces, rewards and episode ends are TextGameDiscreteEnv's, batched along axis 0: a step predicts every sub-env's
    next state in one generation (`TextGameSimulator.advance`). On a GPU that multiplies throughput; on one CPU
    core it does not (textgame-rlvr: 6.6 steps/s with 1 sub-env or 16), because re-reading each ~560-token state
    prompt is already compute-bound.

    ## Seeding
    `reset(seed=s)` seeds sub-env i with s + i (a list gives one seed per sub-env) and draws its start state as a
    TextGameWorldEnv reset with that seed would. Greedy rollouts (temperature 0) equal the single env's; sampled ones
    share one seed per step. `options`: `{"index": i}` (one start state for all, or a list of num_envs) and
    gymnasium's `{"reset_mask": bool array}`.

    ## Autoreset
    `autoreset_mode` NEXT_STEP (gymnasium's default: the step after a sub-env ends resets it and ignores its action)
    or DISABLED (reset ended sub-envs with `reset(options={"reset_mask": ...})`); `rlvr_gym.sim.sb3.SB3VecEnv` hands
    either to SB3.

    `info` (gymnasium's dict of arrays with `_key` masks): `is_success`, `start_index`, `step`, `error` (None or why
    the output was unusable), `candidates`, `uncertainty`, `halted`. `uncertainty_penalty`, `halt_uncertainty` and
    `win_check`: TextGameWorldEnv's guard.
    """

    metadata = {"render_modes": [], "autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def __init__(
        self,
        num_envs: int = 16,
        checkpoint: str | os.PathLike = DEFAULT_CHECKPOINT,
        max_steps: int = DEFAULT_MAX_STEPS,
        temperature: float = 0.0,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        max_candidates: int = DEFAULT_MAX_CANDIDATES,
        obs_dim: int = DEFAULT_OBS_DIM,
        autoreset_mode: str | gym.vector.AutoresetMode = gym.vector.AutoresetMode.NEXT_STEP,
        uncertainty_penalty: float = 0.0,
        halt_uncertainty: float | None = None,
        win_check: str | os.PathLike | None = None,
    ):
        if num_envs < 1 or max_steps < 1:
            raise ValueError(f"num_envs and max_steps must be >= 1, got {num_envs} and {max_steps}")
        self.autoreset_mode = gym.vector.AutoresetMode(autoreset_mode)
        if self.autoreset_mode == gym.vector.AutoresetMode.SAME_STEP:
            raise ValueError("autoreset_mode must be NEXT_STEP or DISABLED")
        self.metadata = {**self.metadata, "autoreset_mode": self.autoreset_mode}
        self.sim = TextGameSimulator(checkpoint, temperature, max_new_tokens, batch_size=num_envs,
                                     uncertainty_penalty=uncertainty_penalty, halt_uncertainty=halt_uncertainty,
                                     win_check=win_check)
        self.num_envs = num_envs
        self.max_steps = max_steps
        self.max_candidates = max_candidates
        self.obs_dim = obs_dim
        self.single_observation_space, self.single_action_space = discrete_spaces(max_candidates, obs_dim)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self._rngs = [np.random.default_rng() for _ in range(num_envs)]
        self._rollouts: list[Rollout | None] = [None] * num_envs
        self._candidates: list[list[str]] = [[] for _ in range(num_envs)]
        self._sent: list[set[str]] = [set() for _ in range(num_envs)]
        self._needs_reset = np.zeros(num_envs, dtype=bool)
        self._steps_taken = 0

    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None):
        mask, seeds, indices = reset_arguments(self.num_envs, seed, options)
        for i in np.flatnonzero(mask):
            if seeds[i] is not None:
                # What gym.Env.reset(seed=s) gives a TextGameWorldEnv: the same start state for the same seed.
                self._rngs[i] = gym.utils.seeding.np_random(int(seeds[i]))[0]
            self._start(i, indices[i])
        self._needs_reset[mask] = False
        return self._observations(), self._infos(mask)

    def step(self, actions):
        if any(r is None for r in self._rollouts):
            raise RuntimeError("call reset() before step()")
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,) or not all(self.single_action_space.contains(int(a)) for a in actions) \
                or actions.dtype.kind not in "iu":
            raise ValueError(f"actions must be {self.num_envs} ints in [0, {self.max_candidates}), got {actions!r}")
        if self.autoreset_mode == gym.vector.AutoresetMode.DISABLED and self._needs_reset.any():
            raise RuntimeError(f"sub-envs {np.flatnonzero(self._needs_reset).tolist()} have ended; with autoreset "
                               "DISABLED reset them with reset(options={'reset_mask': mask})")
        resetting = self._needs_reset.copy()
        for i in np.flatnonzero(resetting):
            self._start(i, None)
        stepping = np.flatnonzero(~resetting)
        rewards = np.zeros(self.num_envs)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        if len(stepping):
            rollouts = [self._rollouts[i] for i in stepping]
            commands = [command_for(int(actions[i]), self._candidates[i], self.single_action_space) for i in stepping]
            # One seed per batched step: greedy rollouts do not use it; sampled ones stay reproducible.
            self.sim.advance(rollouts, commands, seed=rollouts[0].sample_seed + self._steps_taken)
            self._steps_taken += 1
            for i, r, command in zip(stepping, rollouts, commands):
                self._sent[i].add(command)
                self._candidates[i] = candidate_commands(r.state)
                rewards[i] = r.reward
                terminated[i] = r.terminated
                truncated[i] = not r.terminated and (r.ended or r.steps >= self.max_steps)
        self._needs_reset = terminated | truncated
        return self._observations(), rewards, terminated, truncated, self._infos(np.ones(self.num_envs, dtype=bool))

    def action_masks(self) -> np.ndarray:
        """(num_envs, max_candidates): which actions name a candidate, per sub-env."""
        return np.stack([action_mask(c, self.max_candidates) for c in self._candidates])

    def _start(self, i: int, index: int | None) -> None:
        self._rollouts[i] = self.sim.start(self._rngs[i], index)
        self._candidates[i] = candidate_commands(self._rollouts[i].state)
        self._sent[i] = set()

    def _observations(self) -> np.ndarray:
        return np.stack([
            encode_observation(r.state, r.start.objective, c, r.steps / self.max_steps, self.obs_dim, self.max_candidates,
                               sent) if r is not None else np.zeros(self.obs_dim, np.float32)
            for r, c, sent in zip(self._rollouts, self._candidates, self._sent)
        ])

    def _infos(self, mask: np.ndarray) -> dict[str, Any]:
        candidates = np.empty(self.num_envs, dtype=object)
        candidates[:] = [list(c) for c in self._candidates]
        infos: dict[str, Any] = {
            "is_success": np.array([r.won if r else False for r in self._rollouts]),
            "uncertainty": np.array([r.uncertainty if r else 0.0 for r in self._rollouts]),
            "halted": np.array([r.halted if r else False for r in self._rollouts]),
            "start_index": np.array([r.index if r else -1 for r in self._rollouts]),
            "step": np.array([r.steps if r else 0 for r in self._rollouts]),
            "error": np.array([r.error if r else None for r in self._rollouts], dtype=object),
            "candidates": candidates,
        }
        return {**infos, **{f"_{key}": mask.copy() for key in list(infos)}}
