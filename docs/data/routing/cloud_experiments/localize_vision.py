"""Fine-tune a checkpoint's vision tower + connector to say where each layout's object and goal are (the
simulator's positions, never the policy's inputs), through a small head over both cameras' image tokens and the
state, under random camera conditions. Writes the tower's and connector's tensors (transplant_vision.py puts
them into a checkpoint) and prints held-out errors every 500 steps.

    python docs/data/routing/cloud_experiments/localize_vision.py CKPT OUT.pt STEPS LR THREADS TRAIN.npz VAL.npz
"""
import sys, time, numpy as np, torch
from torch import nn
from edgefm_ros.runtime.checkpoint import load_checkpoint
from edgefm_ros.training.model import TrainableSmolVLA, VISION_POS_KEY
from edgefm_ros.training.trainer import load_all
from edgefm_ros.training import export
from edgefm_ros.training.augment import ConditionAugment
ckp, out, steps, lr = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
train_npz, val_npz = sys.argv[6], sys.argv[7]
torch.set_num_threads(int(sys.argv[5])); torch.manual_seed(0)
ck = load_checkpoint(ckp); w = load_all(ck.weights_path)
if export.LM_HEAD_KEY not in w: w[export.LM_HEAD_KEY] = torch.zeros(ck.vlm.text.vocab, ck.vlm.text.hidden)
m = TrainableSmolVLA(ck.config, ck.vlm, w, "legacy")
enc_keys = [k for k in m.keys if "vision_model" in k or "connector" in k]
print("encoder tensors", len(enc_keys), sum(m.params[m.names[k]].numel() for k in enc_keys))
for k in m.keys: m.params[m.names[k]].requires_grad_(k in enc_keys)
tr, va = dict(np.load(train_npz)), dict(np.load(val_npz))
ntask = len(tr["tasks"]); ti_reach, ti_push = list(tr["tasks"]).index("reach"), list(tr["tasks"]).index("push")
Y = np.concatenate([tr["obj"], tr["goal"]], 1); mu, sd = Y.mean(0), Y.std(0) + 1e-3
head = nn.Sequential(nn.Linear(2 * 16 * ck.vlm.text.hidden + 4, 256), nn.GELU(), nn.Linear(256, ntask * 6))
import os
if os.environ.get("HEAD_INIT"): head.load_state_dict(torch.load(os.environ["HEAD_INIT"]))
params = [m.params[m.names[k]] for k in enc_keys] + list(head.parameters())
opt = torch.optim.AdamW(params, lr=lr, weight_decay=1e-4)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1, s / 100) * 0.5 * (1 + np.cos(np.pi * s / steps)))
aug = ConditionAugment(1)
def fwd(scene, wrist, state, task):
    m.model.vision.pos = m.params[m.names[VISION_POS_KEY]][m.pos_ids]
    x = torch.from_numpy(np.concatenate([scene, wrist])).permute(0, 3, 1, 2).float() / 255 * 2 - 1
    t = m.model.embed_images(x); b = len(scene)
    f = torch.cat([t[:b].flatten(1), t[b:].flatten(1), torch.from_numpy(state)], 1)
    o = head(f).view(b, ntask, 6)
    return o[torch.arange(b), torch.from_numpy(task)]
def evaluate(d, augment):
    errs = {}
    with torch.no_grad():
        sc, wr = d["scene"], d["wrist"]
        if augment:
            a = ConditionAugment(7)({"s": sc, "w": wr}); sc, wr = a["s"], a["w"]
        p = np.concatenate([fwd(sc[i:i+200], wr[i:i+200], d["state"][i:i+200], d["task"][i:i+200]).numpy()
                            for i in range(0, len(sc), 200)]) * sd + mu
    y = np.concatenate([d["obj"], d["goal"]], 1)
    for name, ti, sl in (("reach goal", ti_reach, slice(3, 6)), ("push obj", ti_push, slice(0, 3)), ("push goal", ti_push, slice(3, 6))):
        s = d["task"] == ti; e = np.linalg.norm(p[s][:, sl] - y[s][:, sl], axis=1)
        errs[name] = f"{np.median(e)*100:.1f}cm/<5cm {np.mean(e<0.05):.2f}"
    return errs
rng = np.random.default_rng(0); t0 = time.time(); run = []
for step in range(1, steps + 1):
    i = rng.integers(0, len(Y), 64)
    a = aug({"s": tr["scene"][i], "w": tr["wrist"][i]})
    pred = fwd(a["s"], a["w"], tr["state"][i], tr["task"][i])
    loss = ((pred - torch.from_numpy((Y[i] - mu) / sd).float()) ** 2).mean()
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 5.0); opt.step(); sched.step()
    run.append(loss.item())
    if step % 100 == 0:
        print(f"step {step} loss {np.mean(run):.4f} {time.time()-t0:.0f}s", flush=True); run = []
    if step % 500 == 0 or step == steps:
        print("  val clean", evaluate(va, False), "| val aug", evaluate(va, True), flush=True)
sdict = m.state_dict_lerobot()
torch.save({k: sdict[k] for k in enc_keys}, out); torch.save(head.state_dict(), out + ".head")
print("saved", out)
