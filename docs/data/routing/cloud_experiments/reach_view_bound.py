"""How well can the scene camera alone place reach's ball? A ball's pixel fixes a ray from the camera; along
that ray the ball can lie anywhere inside reach-v3's goal box. A perfect single-view localizer guesses the
middle of the ray's chord through the box; the episode succeeds when that is within 5 cm of the ball
(Meta-World's reach threshold). Prints the share of uniformly drawn goals where it is.

    python docs/data/routing/cloud_experiments/reach_view_bound.py
"""
import numpy as np

from edgefm_ros.sim.env import SCENE_CAMERA

LOW, HIGH = np.array([-0.1, 0.8, 0.05]), np.array([0.1, 0.9, 0.3])  # reach-v3's goal range (m)

az, el = np.radians(SCENE_CAMERA.azimuth), np.radians(SCENE_CAMERA.elevation)
forward = np.array([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)])
camera = np.array(SCENE_CAMERA.lookat) - SCENE_CAMERA.distance * forward
rng = np.random.default_rng(0)
steps = np.linspace(-0.5, 0.5, 2001)
errors = []
for goal in rng.uniform(LOW, HIGH, (20000, 3)):
    ray = (goal - camera) / np.linalg.norm(goal - camera)
    inside = np.all((goal + steps[:, None] * ray >= LOW) & (goal + steps[:, None] * ray <= HIGH), axis=1)
    chord = steps[inside]
    errors.append(abs((chord.min() + chord.max()) / 2))
errors = np.array(errors)
print(f"camera at {camera.round(3)}; chord-middle error median {np.median(errors) * 100:.1f} cm; "
      f"within 5 cm: {np.mean(errors < 0.05):.2f}")
