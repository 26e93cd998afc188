"""A position-controlled simulated arm: Meta-World v3 (MuJoCo) behind an absolute end-effector target.

    env = SimEnv(SimConfig())
    env.reset("drawer-open", seed=3)
    env.set_command(np.array([0.0, 0.7, 0.15, -1.0]))  # xyz target (m, world) + gripper effort [-1, 1]
    env.advance(1 / env.config.control_hz)               # physics runs; the controller tracks the target
    images, state = env.render(), env.state()            # {"scene", "wrist"}: uint8 [H, W, 3]; float32 [4]

Control: Meta-World moves the hand through a mocap body welded to it. Our controller runs at the physics
tick (80 Hz, 5 MuJoCo steps of 2.5 ms) and moves the mocap toward the target by at most MAX_STEP_M per axis
per tick (Meta-World's own limit, 0.8 m/s), along a straight line, so it lands on the target and stays there:
holding the last command holds the arm. The target is for the hand position reported by ``state()`` (the
mocap-to-hand offset is measured at reset). The weld is soft: a moving hand trails its target (by ~4 cm at
0.4 m/s) and settles on it within ~0.5 s once the target holds; pressing against an object, the gap is the
force. The gripper command is the finger actuators' effort, as in Meta-World.

Rendering goes through ``mujoco.Renderer`` (EGL or OSMesa, ``MUJOCO_GL``) with shadows, multisampling and
reflections off: a 64x64 frame costs a few ms on one core instead of ~100 ms with MuJoCo's defaults.
"""
from __future__ import annotations

import atexit
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgefm_ros.sim.tasks import TaskSpec, get_task

PHYSICS_TICK_S = 0.0125  # one Meta-World env step: frame_skip 5 x timestep 2.5 ms (checked at load)
MAX_STEP_M = 0.01  # the controller's largest mocap move per tick (Meta-World's action_scale): 0.8 m/s
WORKSPACE_LOW = np.array([-0.5, 0.40, 0.05])  # command clamp (Meta-World's mocap limits for these tasks)
WORKSPACE_HIGH = np.array([0.5, 1.0, 0.5])

# Cameras: "scene" is a free camera facing the robot across the table (upright: table below, robot above);
# "wrist" is Meta-World's gripperPOV, fixed to the hand and looking down (top of the image = away from the
# robot, right = +x).
CAMERAS = ("scene", "wrist")


@dataclass(frozen=True)
class FreeCamera:
    lookat: tuple[float, float, float]  # world point at the image centre (m)
    distance: float  # m from lookat
    azimuth: float  # deg; -90 looks along -y (from across the table toward the robot)
    elevation: float  # deg; negative looks down


SCENE_CAMERA = FreeCamera(lookat=(0.0, 0.7, 0.15), distance=1.15, azimuth=-70.0, elevation=-45.0)


@dataclass(frozen=True)
class SimConfig:
    image_hw: tuple[int, int] = (64, 64)  # camera resolution (H, W)
    cameras: tuple[str, ...] = CAMERAS  # subset/order of "scene", "wrist"
    control_hz: float = 20.0  # the rate a command is meant for (dataset fps); a multiple of the physics tick

    def __post_init__(self) -> None:
        h, w = self.image_hw
        if not (isinstance(h, int) and isinstance(w, int) and 8 <= h <= 1024 and 8 <= w <= 1024):
            raise ValueError(f"SimConfig.image_hw must be two ints in [8, 1024], got {self.image_hw!r}")
        bad = [c for c in self.cameras if c not in CAMERAS]
        if bad or not self.cameras or len(set(self.cameras)) != len(self.cameras):
            raise ValueError(f"SimConfig.cameras {self.cameras!r}: distinct names from {CAMERAS}")
        if not (self.control_hz > 0 and math.isfinite(self.control_hz)):
            raise ValueError(f"SimConfig.control_hz must be positive, got {self.control_hz!r}")
        ticks = 1.0 / (self.control_hz * PHYSICS_TICK_S)
        if abs(ticks - round(ticks)) > 1e-6 or round(ticks) < 1:
            raise ValueError(f"SimConfig.control_hz {self.control_hz!r}: the period must be a whole number of "
                             f"{PHYSICS_TICK_S * 1e3} ms physics ticks (e.g. 80, 40, 20, 10)")

    @property
    def ticks_per_command(self) -> int:
        return round(1.0 / (self.control_hz * PHYSICS_TICK_S))


def _default_gl() -> None:
    """Headless rendering unless the caller chose: EGL (Mesa) by default. MuJoCo reads MUJOCO_GL when it is
    first imported (metaworld imports it), so this runs when this module is imported."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    if os.environ["MUJOCO_GL"] == "osmesa":
        os.environ.setdefault("PYOPENGL_PLATFORM", "osmesa")


_default_gl()


class _TaskWorld:
    """One task's Meta-World env, its renderer and cameras (built once, reused across seeds)."""

    def __init__(self, spec: TaskSpec, image_hw: tuple[int, int]):
        import mujoco
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE

        key = f"{spec.env_name}-goal-observable"
        if key not in ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE:
            raise ValueError(f"task {spec.name!r}: Meta-World has no {key!r}")
        # seed=0: the constructor's own reset draws from a seeded global generator and restores it
        env = ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE[key](seed=0)
        tick = env.frame_skip * env.model.opt.timestep
        if abs(tick - PHYSICS_TICK_S) > 1e-9:
            raise RuntimeError(f"{spec.env_name}: physics tick {tick} s, expected {PHYSICS_TICK_S} s")
        env.max_path_length = 1 << 62  # episodes end by our clock, not Meta-World's 500-step horizon
        # layouts from our own seeded generator (reset draws from env.np_random when this is set)
        env._freeze_rand_vec = False
        env.seeded_rand_vec = True
        model = env.model
        model.vis.quality.shadowsize = 0
        model.vis.quality.offsamples = 0
        model.vis.global_.offheight = max(int(model.vis.global_.offheight), image_hw[0])
        model.vis.global_.offwidth = max(int(model.vis.global_.offwidth), image_hw[1])
        goal = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, "goal")
        if goal >= 0:
            if spec.goal_marker_m > 0:
                model.site_size[goal] = spec.goal_marker_m
                model.site_rgba[goal, 3] = 1.0
            else:
                model.site_rgba[goal, 3] = 0.0
        self.env = env
        self.renderer = mujoco.Renderer(model, image_hw[0], image_hw[1])
        self.renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        cam = mujoco.MjvCamera()
        cam.type = mujoco.mjtCamera.mjCAMERA_FREE
        cam.lookat[:] = SCENE_CAMERA.lookat
        cam.distance = SCENE_CAMERA.distance
        cam.azimuth = SCENE_CAMERA.azimuth
        cam.elevation = SCENE_CAMERA.elevation
        self.cameras: dict[str, Any] = {"scene": cam, "wrist": "gripperPOV"}

    def close(self) -> None:
        self.renderer.close()
        self.env.close()


class SimEnv:
    """The simulated arm (see the module docstring). Not thread-safe: one thread drives it."""

    def __init__(self, config: SimConfig = SimConfig()):
        self.config = config
        self._worlds: dict[str, _TaskWorld] = {}
        self._world: _TaskWorld | None = None
        self.task: TaskSpec | None = None
        self.seed: int | None = None
        self._ticks = 0
        self._pending_s = 0.0
        self._goal = np.zeros(3)  # the controller's mocap target (world, m)
        self._grip = 0.0
        self._offset = np.zeros(3)  # mocap minus hand at rest
        self._obs = np.zeros(39)
        self._success = False
        atexit.register(self.close)  # renderers freed while EGL is still loaded (close() unregisters)

    # episode ------------------------------------------------------------------------------------------------
    def reset(self, task: str, seed: int) -> None:
        """Start ``task`` on the layout of ``seed`` (the same seed always gives the same layout)."""
        spec = get_task(task)
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        world = self._worlds.get(spec.name)
        if world is None:
            world = self._worlds[spec.name] = _TaskWorld(spec, self.config.image_hw)
            # exit handlers run last-registered first, and MuJoCo registers EGL's eglTerminate when it makes the
            # process's first GL context (just now, for the first world): registered again, close() runs
            # before it, while the renderers can still be freed
            atexit.unregister(self.close)
            atexit.register(self.close)
        from gymnasium.utils import seeding

        env = world.env
        env.np_random, _ = seeding.np_random(int(seed))
        obs, _ = env.reset()
        self._world, self.task, self.seed = world, spec, int(seed)
        self._obs = np.asarray(obs, dtype=np.float64)
        mocap = env.data.mocap_pos[0].copy()
        self._offset = mocap - self._obs[:3]
        self._goal = mocap
        self._grip = -1.0  # Meta-World's reset leaves the gripper open
        self._ticks = 0
        self._pending_s = 0.0
        self._success = False

    @property
    def sim_time(self) -> float:
        """Simulated seconds since reset (whole physics ticks)."""
        return self._ticks * PHYSICS_TICK_S

    # control ------------------------------------------------------------------------------------------------
    def set_command(self, target: Any) -> None:
        """Absolute target float [4]: hand xyz (m, world; clamped to the workspace) + gripper effort [-1, 1]."""
        t = np.asarray(target, dtype=np.float64)
        if t.shape != (4,):
            raise ValueError(f"command must have shape (4,) = xyz + gripper, got shape {t.shape}: {target!r}")
        if not np.all(np.isfinite(t)):
            raise ValueError(f"command holds non-finite values: {t.tolist()}")
        self._need_world()
        xyz = np.clip(t[:3], WORKSPACE_LOW, WORKSPACE_HIGH)
        self._goal = xyz + self._offset
        self._grip = float(np.clip(t[3], -1.0, 1.0))

    def command(self) -> np.ndarray:
        """The target being tracked, float32 [4] (hand xyz + gripper), as ``set_command`` took it."""
        return np.concatenate([self._goal - self._offset, [self._grip]]).astype(np.float32)

    def advance(self, seconds: float) -> None:
        """Run physics for ``seconds`` (whole ticks; the remainder carries over to the next call)."""
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"advance: seconds must be finite and >= 0, got {seconds!r}")
        world = self._need_world()
        self._pending_s += seconds
        n = int(math.floor(self._pending_s / PHYSICS_TICK_S + 1e-9))
        self._pending_s -= n * PHYSICS_TICK_S
        env = world.env
        for _ in range(n):
            err = self._goal - env.data.mocap_pos[0]
            peak = float(np.max(np.abs(err)))
            step = err if peak <= MAX_STEP_M else err * (MAX_STEP_M / peak)  # straight line, <= 1 cm per axis
            action = np.empty(4, dtype=np.float64)
            action[:3] = step / env.action_scale
            action[3] = self._grip
            obs, _, _, _, info = env.step(action)
            self._obs = obs
            self._success = bool(info.get("success", 0.0))
            self._ticks += 1

    # observation --------------------------------------------------------------------------------------------
    def state(self) -> np.ndarray:
        """Proprioception float32 [4]: hand xyz (m, world) + gripper opening in [0, 1] (1 = open)."""
        self._need_world()
        return self._obs[:4].astype(np.float32)

    def observation(self) -> np.ndarray:
        """Meta-World's full observation float64 [39] (objects and goal: for the expert, never the policy)."""
        self._need_world()
        return self._obs.copy()

    def reference(self) -> np.ndarray:
        """Where the controller holds the hand now (mocap minus offset), float64 [3]."""
        world = self._need_world()
        return world.env.data.mocap_pos[0] - self._offset

    def success(self) -> bool:
        return self._success

    def render(self) -> dict[str, np.ndarray]:
        """{camera: uint8 [H, W, 3]} for ``config.cameras``, upright."""
        world = self._need_world()
        out = {}
        r = world.renderer
        for name in self.config.cameras:
            r.update_scene(world.env.data, camera=world.cameras[name])
            out[name] = r.render().copy()
        return out

    def close(self) -> None:
        for w in self._worlds.values():
            w.close()
        self._worlds.clear()
        self._world = None
        atexit.unregister(self.close)

    def _need_world(self) -> _TaskWorld:
        if self._world is None:
            raise RuntimeError("SimEnv: call reset(task, seed) first")
        return self._world

    def __enter__(self) -> "SimEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
