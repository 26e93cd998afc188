"""A checkpoint written by ``edgefm-vla train`` in LeRobot 0.4.4: same actions, and task success in our simulator.

    python benchmarks/lerobot_trained_check.py actions --checkpoint checkpoints/smolvla-metaworld \
        --dataset DIR [--frames 16]
    python benchmarks/lerobot_trained_check.py sim --checkpoint checkpoints/smolvla-metaworld \
        [--tasks T1,T2] --seeds 1000-1019 [--json out.json]

Both run LeRobot in its own interpreter (the harness venv, ``--lerobot-python``, default
/work/lerobot-venv/bin/python, with the harness folder ``--harness`` for its offline set-up and
torchvision shim): a worker process loads the checkpoint exactly as LeRobot does
(``PreTrainedConfig.from_pretrained`` -> ``SmolVLAPolicy`` -> ``_load_as_safetensor`` strict, the
checkpoint's own ``policy_{pre,post}processor.json`` through ``PolicyProcessorPipeline.from_pretrained``),
with ``vlm_model_name`` and the tokenizer step pointed at the checkpoint's ``vlm/`` folder. It answers
observations (raw camera frames, state, task, noise) with LeRobot's unnormalised action chunk.

``actions``: dataset frames (or simulator renders) through our Engine (exact mode, the checkpoint's
recorded vision position ids) and through LeRobot with the same noise; prints the largest difference.
``sim``: per task and seed, one episode with our Engine and one with LeRobot's policy (the same noise
stream, seeded by the episode seed) through edgefm_ros.sim.rollout.run_episode; success side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import struct
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


# ---- framing: length-prefixed pickles over the worker's stdin/stdout ---------------------------------------
def send(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=4)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def recv(stream):
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("worker closed its pipe")
    (n,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(n))


# ---- the LeRobot side (runs in the harness venv) -------------------------------------------------------------
def worker(checkpoint: Path, harness: Path) -> int:
    out = os.fdopen(os.dup(1), "wb")  # the pipe; fd 1 goes to stderr so library prints cannot corrupt it
    os.dup2(2, 1)
    sys.path.insert(0, str(harness))
    import common  # noqa: F401  (offline environment + torchvision shim, before lerobot/transformers)
    import numpy as np
    import torch
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import (batch_to_transition, policy_action_to_transition,
                                              transition_to_batch, transition_to_policy_action)

    torch.set_num_threads(int(os.environ.get("LEROBOT_THREADS", "1")))
    vlm = str((checkpoint / "vlm").resolve())
    cfg = PreTrainedConfig.from_pretrained(str(checkpoint))
    cfg.device = "cpu"
    cfg.vlm_model_name = vlm  # the checkpoint's backbone folder (config, tokenizer, processor files)
    policy = SmolVLAPolicy(cfg)
    policy.to(torch.float32)
    policy = SmolVLAPolicy._load_as_safetensor(policy, str(checkpoint / "model.safetensors"), "cpu", True)
    policy.eval()
    pre = PolicyProcessorPipeline.from_pretrained(
        str(checkpoint), config_filename="policy_preprocessor.json",
        overrides={"tokenizer_processor": {"tokenizer_name": vlm}},
        to_transition=batch_to_transition, to_output=transition_to_batch)
    post = PolicyProcessorPipeline.from_pretrained(
        str(checkpoint), config_filename="policy_postprocessor.json", overrides={},
        to_transition=policy_action_to_transition, to_output=transition_to_policy_action)
    send(out, {"ready": True, "chunk_size": cfg.chunk_size, "max_action_dim": cfg.max_action_dim})
    inp = sys.stdin.buffer
    while True:
        try:
            req = recv(inp)
        except EOFError:
            return 0
        if req is None:
            return 0
        batch = {k: torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).float().div(255.0)[None]
                 for k, img in req["images"].items()}
        batch["observation.state"] = torch.from_numpy(np.asarray(req["state"], np.float32))[None]
        batch["task"] = [req["task"]]
        t0 = time.perf_counter()
        with torch.no_grad():
            proc = pre(batch)
            policy.reset()
            norm = policy.predict_action_chunk(proc, noise=torch.from_numpy(req["noise"])[None])
            actions = post(norm)
        send(out, {"actions": actions[0].numpy().astype(np.float32), "normalised": norm[0].numpy(),
                   "seconds": time.perf_counter() - t0})


class LeRobotWorker:
    """The worker process, as a callable: (images {key: uint8 HWC}, state, task, noise) -> actions [C, A]."""

    def __init__(self, checkpoint: Path, python: str, harness: Path):
        env = {k: v for k, v in os.environ.items()
               if k not in ("_ROS_WHEELS_BOOTSTRAP_COMPLETE", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV")}
        env["PYTHONPATH"] = str(harness)
        self.proc = subprocess.Popen([python, str(HERE), "worker", "--checkpoint", str(checkpoint),
                                      "--harness", str(harness)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, cwd=str(harness))
        hello = recv(self.proc.stdout)
        self.chunk_size, self.max_action_dim = hello["chunk_size"], hello["max_action_dim"]

    def __call__(self, images, state, task, noise):
        send(self.proc.stdin, {"images": images, "state": state, "task": task, "noise": noise})
        return recv(self.proc.stdout)

    def close(self) -> None:
        try:
            send(self.proc.stdin, None)
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


# ---- our side -------------------------------------------------------------------------------------------------
def cmd_actions(args) -> int:
    import numpy as np

    from edgefm_ros.runtime.engine import Engine
    from edgefm_ros.sim.dataset import read_dataset
    from edgefm_ros.types import Observation

    engine = Engine.from_checkpoint(args.checkpoint, mode="exact")
    demos = read_dataset(args.dataset)
    lr = LeRobotWorker(args.checkpoint, args.lerobot_python, args.harness)
    rng = np.random.default_rng(args.seed)
    frames = rng.choice(len(demos), size=min(args.frames, len(demos)), replace=False)
    shape = (engine.model_config.chunk_size, engine.model_config.max_action_dim)
    worst, rows = 0.0, []
    try:
        for i in frames:
            images = {f"observation.images.{c}": demos.images[c][i] for c in demos.images}
            state = demos.state[i]
            task = demos.tasks[int(demos.task_index[i])]
            noise = rng.standard_normal(shape).astype(np.float32)
            ours = engine.predict(Observation(images, state, task), noise=noise).actions
            theirs = lr(images, state, task, noise)["actions"]
            diff = float(np.abs(ours - theirs).max())
            scale = float(np.abs(theirs).max())
            worst = max(worst, diff)
            rows.append({"frame": int(i), "task": task, "max_abs_diff": diff, "max_abs_action": scale})
            print(f"frame {int(i):6d}  {task[:40]:40s}  max |ours - lerobot| = {diff:.2e}  (|action| <= {scale:.3f})")
    finally:
        lr.close()
    print(f"{len(rows)} observations: largest difference {worst:.2e} (engine {engine.vision_position_ids} "
          f"vision position ids, exact mode)")
    if args.json:
        Path(args.json).write_text(json.dumps({"max_abs_diff": worst, "rows": rows}, indent=2))
    return 0 if worst <= args.tolerance else 1


def cmd_sim(args) -> int:
    import numpy as np

    from edgefm_ros.runtime.engine import Engine
    from edgefm_ros.sim.env import SimConfig, SimEnv
    from edgefm_ros.sim.rollout import EnginePolicy, checkpoint_settings, checkpoint_tasks, run_episode
    from edgefm_ros.sim.tasks import parse_tasks

    st = checkpoint_settings(args.checkpoint)
    tasks = parse_tasks(args.tasks) if args.tasks else checkpoint_tasks(args.checkpoint)
    a, _, b = args.seeds.partition("-")
    seeds = range(int(a), int(b or a) + 1)
    sim = SimConfig(image_hw=st["image_hw"], cameras=st["cameras"])
    ours = EnginePolicy(Engine.from_checkpoint(args.checkpoint, mode="exact"), sim.cameras)
    lr = LeRobotWorker(args.checkpoint, args.lerobot_python, args.harness)

    class LeRobotPolicy:
        """LeRobot's SmolVLAPolicy as a ChunkPolicy; noise seeded per episode like EnginePolicy."""

        def __init__(self):
            self.rng = np.random.default_rng(0)

        def reset(self, seed):
            self.rng = np.random.default_rng(seed)

        def __call__(self, images, state, instruction):
            noise = self.rng.standard_normal((lr.chunk_size, lr.max_action_dim)).astype(np.float32)
            return lr({f"observation.images.{c}": img for c, img in images.items()}, state, instruction,
                      noise)["actions"][:, :4]

    theirs = LeRobotPolicy()
    results = {t: {"edgefm": [], "lerobot": []} for t in tasks}
    t0 = time.perf_counter()
    try:
        with SimEnv(sim) as env:
            for task in tasks:
                for seed in seeds:
                    for name, pol in (("edgefm", ours), ("lerobot", theirs)):
                        r = run_episode(env, pol, task, seed, n_action_steps=st["n_action_steps"])
                        results[task][name].append(bool(r.success))
                    e, l_ = results[task]["edgefm"][-1], results[task]["lerobot"][-1]
                    print(f"[{time.perf_counter() - t0:5.0f}s] {task}:{seed}  edgefm {'ok' if e else '--'}  "
                          f"lerobot {'ok' if l_ else '--'}", flush=True)
    finally:
        lr.close()
    table = {t: {k: float(np.mean(v)) for k, v in r.items()} for t, r in results.items()}
    overall = {k: float(np.mean([s for r in results.values() for s in r[k]])) for k in ("edgefm", "lerobot")}
    agree = float(np.mean([x == y for r in results.values() for x, y in zip(r["edgefm"], r["lerobot"])]))
    print(f"\n{'task':24s} {'edgefm':>8s} {'lerobot 0.4.4':>14s}")
    for t, r in table.items():
        print(f"{t:24s} {r['edgefm']:8.0%} {r['lerobot']:14.0%}")
    print(f"{'all':24s} {overall['edgefm']:8.0%} {overall['lerobot']:14.0%}   "
          f"(same outcome on {agree:.0%} of episodes)")
    if args.json:
        Path(args.json).write_text(json.dumps({"seeds": args.seeds, "tasks": table, "overall": overall,
                                               "same_outcome": agree, "episodes": results}, indent=2))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("actions", "sim", "worker"):
        p = sub.add_parser(name)
        p.add_argument("--checkpoint", required=True, type=Path)
        p.add_argument("--harness", type=Path, default=Path("/work/lerobot_harness"))
        p.add_argument("--lerobot-python", default="/work/lerobot-venv/bin/python")
        p.add_argument("--json", default=None)
        if name == "actions":
            p.add_argument("--dataset", required=True)
            p.add_argument("--frames", type=int, default=16)
            p.add_argument("--seed", type=int, default=0)
            p.add_argument("--tolerance", type=float, default=1e-4)
        if name == "sim":
            p.add_argument("--tasks", default=None)
            p.add_argument("--seeds", default="1000-1019")
    args = ap.parse_args()
    args.checkpoint = args.checkpoint.resolve()
    if args.cmd == "worker":
        return worker(args.checkpoint, args.harness)
    return cmd_actions(args) if args.cmd == "actions" else cmd_sim(args)


if __name__ == "__main__":
    sys.exit(main())
