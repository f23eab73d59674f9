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
    query_devices = ctypes.CFUNCTYPE(ctypes.c_uint, ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))(address)
    count = ctypes.c_int(0)
    return bool(query_devices(0, None, ctypes.byref(count))) and count.value > 0


def choose_gl_backend() -> str:
    """Set MUJOCO_GL to egl, or osmesa when no EGL device exists, unless it is set or mujoco is already imported."""
    if "MUJOCO_GL" not in os.environ and "mujoco" not in sys.modules:
        os.environ["MUJOCO_GL"] = "egl" if egl_device_available() else "osmesa"
    return os.environ.get("MUJOCO_GL", "")
