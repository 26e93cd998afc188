"""Frames of the seeds' layouts (the hand moved somewhere first in 60% of them) with the objects' and the goal's
positions, for localize_vision.py.

    python docs/data/routing/cloud_experiments/layouts.py OUT.npz FIRST_SEED N [TASKS]
    (the experiment: 100 900 for training, 3000 100 for validation)
"""
import sys, time, numpy as np
from edgefm_ros.sim.env import SimEnv, SimConfig
from edgefm_ros.sim.tasks import TASKS
out, first, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tasks = sys.argv[4].split(",") if len(sys.argv) > 4 else list(TASKS)[:6]
rng = np.random.default_rng(first)
env = SimEnv(SimConfig(image_hw=(128, 128)))
S, W, ST, OBJ, GOAL, T = [], [], [], [], [], []
t0 = time.time()
for i in range(n):
    for ti, task in enumerate(tasks):
        env.reset(task, first + i)
        if rng.random() < 0.6:  # move the hand somewhere first
            tgt = np.array([rng.uniform(-0.2, 0.2), rng.uniform(0.45, 0.9), rng.uniform(0.06, 0.3)])
            env.set_command(np.concatenate([tgt, [rng.uniform(0, 1)]]))
            env.advance(rng.uniform(0.1, 0.8))
        im = env.render(); o = env.observation()
        S.append(im["scene"]); W.append(im["wrist"]); ST.append(env.state())
        OBJ.append(o[4:7]); GOAL.append(o[-3:]); T.append(ti)
    if i % 50 == 0:
        print(i, f"{time.time()-t0:.0f}s", flush=True)
np.savez_compressed(out, scene=np.array(S), wrist=np.array(W), state=np.array(ST), obj=np.array(OBJ),
                    goal=np.array(GOAL), task=np.array(T), tasks=np.array(tasks))
print("done", len(S), f"{time.time()-t0:.0f}s")
