"""The tabletop scene: MJCF and the geometry constants the env, tasks and policies share.

Frame: x to the right of the camera, y away from it, z up; the table top is z = 0.
The gripper's slide joints are world x, y, z and its hinge is yaw, so its qpos is its palm's world pose.
"""

import mujoco
import numpy as np

IMAGE_SIZE = 64
OBJECT_BODIES = ("red", "green", "blue")
OBJECT_NAMES = ("red cube", "green cube", "blue can")
OBJECT_HALF_SIZE = 0.025
GRIPPER_LOW = np.array([-0.34, -0.24, 0.094])
GRIPPER_HIGH = np.array([0.24, 0.24, 0.30])
GRIPPER_YAW_LIMIT = np.pi
FINGER_TRAVEL = 0.025
FINGER_HALF_THICKNESS = 0.006
FINGER_PAD_HALF_WIDTH = 0.025
CABINET_POS = np.array([0.30, 0.06, 0.0])
DRAWER_HEIGHT = 0.07
DRAWER_TRAVEL = 0.13
HANDLE_OFFSET = 0.125
TARGET_RADIUS = 0.035
TARGET_HALF_HEIGHT = 0.0005

_CUBE = f"{OBJECT_HALF_SIZE} {OBJECT_HALF_SIZE} {OBJECT_HALF_SIZE}"
_FINGER = f"{FINGER_HALF_THICKNESS} {FINGER_PAD_HALF_WIDTH} 0.04"
_CABINET = "0.35 0.37 0.42 1"
_WOOD = "0.82 0.55 0.28 1"
_HANDLE = "0.1 0.1 0.1 1"

SCENE_XML = f"""
<mujoco model="rt1_tabletop">
  <compiler autolimits="true" angle="radian"/>
  <option timestep="0.005" integrator="implicitfast"/>
  <visual>
    <quality shadowsize="0" offsamples="0"/>
    <global offwidth="{IMAGE_SIZE}" offheight="{IMAGE_SIZE}"/>
    <headlight ambient="0.45 0.45 0.45" diffuse="0.45 0.45 0.45" specular="0 0 0"/>
  </visual>
  <default>
    <!-- solref 0.01 (twice the timestep) keeps the light fingers from sinking through the handle. -->
    <geom friction="0.5 0.01 0.001" solref="0.01 1" contype="1" conaffinity="1"/>
    <!-- Bit 2 lets the cabinet touch the gripper and objects but not its own drawer. -->
    <default class="cabinet"><geom type="box" rgba="{_CABINET}" contype="2" conaffinity="2"/></default>
    <default class="drawer"><geom type="box" rgba="{_WOOD}" mass="0.1"/></default>
    <default class="moving"><geom contype="3" conaffinity="3"/></default>
  </default>
  <worldbody>
    <light pos="0.2 -0.4 1.5" dir="-0.1 0.3 -1" diffuse="0.45 0.45 0.45" specular="0 0 0" castshadow="false"/>
    <camera name="front" pos="-0.03 -0.46 0.78" xyaxes="1 0 0 0 0.843 0.538" fovy="45"/>
    <geom name="floor" type="plane" size="2 2 0.1" pos="0 0 -0.75" rgba="0.22 0.22 0.25 1"/>
    <geom name="table" type="box" size="0.42 0.32 0.02" pos="0 0 -0.02" rgba="0.8 0.78 0.74 1"/>
    <geom name="target" type="cylinder" size="{TARGET_RADIUS} {TARGET_HALF_HEIGHT}" pos="0 0 {TARGET_HALF_HEIGHT}"
          rgba="1 0.85 0 1" contype="0" conaffinity="0"/>

    <body name="cabinet" pos="{CABINET_POS[0]} {CABINET_POS[1]} {CABINET_POS[2]}">
      <geom class="cabinet" size="0.085 0.11 0.005" pos="0 0 0.13"/>
      <geom class="cabinet" size="0.085 0.11 0.005" pos="0 0 0.005"/>
      <geom class="cabinet" size="0.085 0.005 0.0675" pos="0 0.105 0.0675"/>
      <geom class="cabinet" size="0.085 0.005 0.0675" pos="0 -0.105 0.0675"/>
      <geom class="cabinet" size="0.005 0.11 0.0675" pos="0.08 0 0.0675"/>
      <body name="drawer" pos="0 0 {DRAWER_HEIGHT}">
        <joint name="drawer" type="slide" axis="-1 0 0" range="0 {DRAWER_TRAVEL}" damping="5" frictionloss="0.5"/>
        <geom class="drawer" size="0.075 0.095 0.005" pos="0 0 -0.05"/>
        <geom class="drawer" size="0.005 0.1 0.05" pos="-0.08 0 0" rgba="0.9 0.62 0.33 1"/>
        <geom class="drawer" size="0.07 0.005 0.035" pos="0 0.09 -0.01"/>
        <geom class="drawer" size="0.07 0.005 0.035" pos="0 -0.09 -0.01"/>
        <geom class="drawer" size="0.005 0.09 0.035" pos="0.07 0 -0.01"/>
        <geom name="handle" type="capsule" fromto="-{HANDLE_OFFSET} -0.05 0 -{HANDLE_OFFSET} 0.05 0" size="0.009"
              rgba="{_HANDLE}" mass="0.02"/>
        <geom class="drawer" size="0.02 0.005 0.005" pos="-0.105 -0.05 0" rgba="{_HANDLE}"/>
        <geom class="drawer" size="0.02 0.005 0.005" pos="-0.105 0.05 0" rgba="{_HANDLE}"/>
      </body>
    </body>

    <body name="red" pos="-0.1 0 {OBJECT_HALF_SIZE}" childclass="moving">
      <freejoint name="red"/>
      <geom type="box" size="{_CUBE}" rgba="0.92 0.1 0.1 1" mass="0.1"/>
    </body>
    <body name="green" pos="-0.2 0 {OBJECT_HALF_SIZE}" childclass="moving">
      <freejoint name="green"/>
      <geom type="box" size="{_CUBE}" rgba="0.1 0.75 0.15 1" mass="0.1"/>
    </body>
    <body name="blue" pos="0 0 {OBJECT_HALF_SIZE}" childclass="moving">
      <freejoint name="blue"/>
      <geom type="cylinder" size="{OBJECT_HALF_SIZE} {OBJECT_HALF_SIZE}" rgba="0.1 0.25 0.95 1" mass="0.1"/>
    </body>

    <body name="gripper" pos="0 0 0" gravcomp="1" childclass="moving">
      <joint name="gripper_x" type="slide" axis="1 0 0" damping="60" range="{GRIPPER_LOW[0]} {GRIPPER_HIGH[0]}"/>
      <joint name="gripper_y" type="slide" axis="0 1 0" damping="60" range="{GRIPPER_LOW[1]} {GRIPPER_HIGH[1]}"/>
      <joint name="gripper_z" type="slide" axis="0 0 1" damping="60" range="{GRIPPER_LOW[2]} {GRIPPER_HIGH[2]}"/>
      <joint name="gripper_yaw" type="hinge" axis="0 0 1" damping="1.5"
             range="-{GRIPPER_YAW_LIMIT} {GRIPPER_YAW_LIMIT}"/>
      <geom name="palm" type="box" size="0.04 {FINGER_PAD_HALF_WIDTH} 0.012" rgba="0.12 0.12 0.14 1" mass="0.5"/>
      <geom name="wrist" type="cylinder" size="0.012 0.2" pos="0 0 0.212" rgba="0.55 0.55 0.6 1" mass="0.01"
            contype="0" conaffinity="0"/>
      <!-- Low-friction pads (priority picks their friction) slide along a pushed object instead of dragging it. -->
      <body name="finger_left" pos="-0.031 0 -0.05" gravcomp="1">
        <joint name="finger_left" type="slide" axis="1 0 0" damping="5" range="0 {FINGER_TRAVEL}"/>
        <geom type="box" size="{_FINGER}" rgba="0.92 0.92 0.95 1" mass="0.08" friction="0.1 0.01 0.001" priority="1"/>
      </body>
      <body name="finger_right" pos="0.031 0 -0.05" gravcomp="1">
        <joint name="finger_right" type="slide" axis="-1 0 0" damping="5" range="0 {FINGER_TRAVEL}"/>
        <geom type="box" size="{_FINGER}" rgba="0.92 0.92 0.95 1" mass="0.08" friction="0.1 0.01 0.001" priority="1"/>
      </body>
    </body>
  </worldbody>
  <contact><exclude body1="finger_left" body2="finger_right"/></contact>
  <actuator>
    <position name="gripper_x" joint="gripper_x" kp="1500"/>
    <position name="gripper_y" joint="gripper_y" kp="1500"/>
    <position name="gripper_z" joint="gripper_z" kp="1500"/>
    <position name="gripper_yaw" joint="gripper_yaw" kp="40"/>
    <position name="finger_left" joint="finger_left" kp="300"/>
    <position name="finger_right" joint="finger_right" kp="300"/>
  </actuator>
</mujoco>
"""


def load_model() -> mujoco.MjModel:
    """Compile the tabletop scene."""
    return mujoco.MjModel.from_xml_string(SCENE_XML)
