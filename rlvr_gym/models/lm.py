"""Causal language models: small Llama configs trained from scratch here, or any local Hugging Face checkpoint."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from rlvr_gym.files import CheckpointError

hf_logging.disable_progress_bar()  # per-file load/save bars drown the training progress bar

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "checkpoints"


@dataclass
class LlamaSize:
    """A small Llama shape; ~6 x parameters FLOPs per trained token (CALIBRATION.md: 1.7k tokens/s at 5M)."""

    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    intermediate_size: int = 344
    max_positions: int = 2048


def build_llama(vocab_size: int, size: LlamaSize, tokenizer: PreTrainedTokenizerBase | None = None) -> LlamaForCausalLM:
    special = {}
    if tokenizer is not None:
        special = dict(
            pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id
        )
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.heads,
        max_position_embeddings=size.max_positions,
        tie_word_embeddings=True,
        **special,
    )
    return LlamaForCausalLM(config)


def resolve_checkpoint(name_or_dir: str | os.PathLike) -> Path:
    """A shipped checkpoint name (see `rlvr_gym/checkpoints/`) or a directory, checked to hold a model."""
    path = Path(name_or_dir)
    if not path.exists() and (SHIPPED_DIR / str(name_or_dir)).is_dir():
        path = SHIPPED_DIR / str(name_or_dir)
    if not path.is_dir():
        shipped = sorted(p.name for p in SHIPPED_DIR.iterdir() if p.is_dir()) if SHIPPED_DIR.is_dir() else []
        raise CheckpointError(f"checkpoint {str(name_or_dir)!r} is neither a directory nor a shipped name {shipped}")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"checkpoint {path} has no config.json: not a Hugging Face model directory")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise CheckpointError(f"checkpoint {path} has no weights (*.safetensors): was it saved completely?")
    return path


def load_model(name_or_dir: str | os.PathLike, dtype: torch.dtype = torch.float32):
    """Load (model, tokenizer) from a shipped name or a local Hugging Face directory; tokenizer may be None."""
    path = resolve_checkpoint(name_or_dir)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except Exception as error:  # transformers raises many types for a damaged directory
        raise CheckpointError(f"checkpoint {path} could not be loaded ({type(error).__name__}: {error})") from error
    tokenizer = None
    if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except Exception as error:
            raise CheckpointError(f"tokenizer in {path} could not be loaded ({type(error).__name__}: {error})") from error
    return model, tokenizer


def pick_device(name: str | torch.device = "auto") -> torch.device:
    """`auto` is the first GPU when there is one, else the CPU; anything else is passed to torch.device. A device
    this machine lacks is a ValueError here rather than an error deep inside the first forward pass."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ValueError(f"device {name!r} is not a torch device (try 'cpu', 'cuda', 'cuda:1' or 'auto'): "
                         f"{error}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r}: this machine has no CUDA GPU that torch can use; pass 'cpu' or 'auto'")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    return device


def context_length(model: torch.nn.Module) -> int:
    """Positions the model was built for (prompt and completion together); unbounded when its config names none."""
    return getattr(model.config, "max_position_embeddings", None) or 1 << 30


def context_of(name_or_dir: str | os.PathLike) -> int:
    """`context_length` of a checkpoint, read from its config without loading the weights."""
    path = resolve_checkpoint(name_or_dir)
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as error:
        raise CheckpointError(f"checkpoint {path} has no readable config ({type(error).__name__}: {error})") from error
    return getattr(config, "max_position_embeddings", None) or 1 << 30


def extend_context(src: str | os.PathLike, dst: str | os.PathLike, positions: int) -> Path:
    """Copy a rotary-position model (and its tokenizer) from `src` to `dst` with its context raised to `positions`.
    Its weights do not depend on the context, so this is only the config; fine-tuning on the longer examples teaches
    the new positions. A model with learned position embeddings cannot be extended: ValueError."""
    model, tokenizer = load_model(src)
    rope = getattr(model.config, "rope_parameters", None) or getattr(model.config, "rope_theta", None)
    if not rope or not hasattr(model.config, "max_position_embeddings"):
        raise ValueError(
            f"{src} has {context_length(model)} positions and no rotary position embedding to extend to {positions}: "
            "lower the length limits or train a model with a longer context"
        )
    model.config.max_position_embeddings = max(positions, context_length(model))
    dst = Path(dst)
    model.save_pretrained(dst)
    if tokenizer is not None:
        tokenizer.save_pretrained(dst)
    return dst


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def ship_lm(src: str | os.PathLike, dst: str | os.PathLike, dtype: torch.dtype = torch.float16) -> Path:
    """Copy a checkpoint's model (in `dtype`, half the bytes in fp16) and tokenizer to `dst`; loading casts back."""
    model, tokenizer = load_model(src)
    dst = Path(dst)
    model.to(dtype).save_pretrained(dst)
    if tokenizer is not None:
        tokenizer.save_pretrained(dst)
    return dst


def load_tokenizer(name_or_dir: str | os.PathLike) -> PreTrainedTokenizerBase:
    """The tokenizer saved with a checkpoint, checked to be usable by a text world model."""
    path = resolve_checkpoint(name_or_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as error:  # transformers raises many types for a missing or damaged tokenizer
        raise CheckpointError(f"tokenizer in {path} could not be loaded ({type(error).__name__}: {error})") from error
    return checked_tokenizer(tokenizer, path)


def checked_tokenizer(tokenizer: PreTrainedTokenizerBase | None, path: str | os.PathLike) -> PreTrainedTokenizerBase:
    if tokenizer is None:
        raise CheckpointError(
            f"checkpoint {path} has no tokenizer: a text world model needs the tokenizer it was trained with beside it"
        )
    if tokenizer.eos_token_id is None:
        raise CheckpointError(f"the tokenizer of {path} has no eos token, so completions could not end")
    return tokenizer
