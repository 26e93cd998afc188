"""SmolVLA with trainable weights: the runtime's modules (models/) built on ``nn.Parameter``s, and the
training forward, LeRobot's ``VLAFlowMatching.forward`` over those modules.

The modules are built through the dispatch resolver with the reference table (plain PyTorch ops that
use the weights as given, so autograd reaches every parameter) and SDPA attention. Each weight is one
``nn.Parameter`` keyed by its LeRobot checkpoint name, so saving is ``{name: p.detach()}``.

The training forward runs LeRobot's single pass: prefix (images, language, state) and suffix (noisy
action tokens) with the full 2-D attention mask made from pad masks and autoregressive blocks
(images + language one bidirectional block, the state its own block, each action token its own), and
position ids ``cumsum(pad) - 1``. Prefix rows never see suffix columns under that mask, so the pass is
computed as the VLM layers over the prefix rows (``SmolLM.prefix_kv``) followed by the expert over the
suffix rows (``SmolVLA.velocity``), each with its slice of the one mask: the same functions the
Engine's prefill/decode run, and tests/training check the velocities agree.
"""
from __future__ import annotations

import torch
from torch import nn

from edgefm_ros.models import siglip
from edgefm_ros.models.config import SmolVLAConfig, VlmConfig
from edgefm_ros.models.smolvla import SmolVLA
from edgefm_ros.runtime.checkpoint import IGNORED_KEYS, CheckpointError, Scoped
from edgefm_ros.dispatch.table import OpResolver, Record, Table, builtin_tables, load_table
from edgefm_ros.runtime.preprocess import ModelInputs

VISION_PREFIX = "model.vlm_with_expert.vlm.model.vision_model."  # the vision tower's weights (not the connector)
VISION_POS_KEY = VISION_PREFIX + "embeddings.position_embedding.weight"


class ParamSource:
    """The weight source models/ builds from (``scoped(prefix)(key, *shape)``), handing out parameters."""

    def __init__(self, params: nn.ParameterDict | dict[str, nn.Parameter], names: dict[str, str]):
        self.params, self.names, self.used = params, names, set()

    def take(self, key: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if key not in self.names:
            raise CheckpointError(f"missing weight {key!r} (expected shape {list(shape)})")
        p = self.params[self.names[key]]
        if tuple(p.shape) != tuple(shape):
            raise CheckpointError(f"weight {key!r} has shape {list(p.shape)}, expected {list(shape)}")
        self.used.add(key)
        return p

    def scoped(self, prefix: str) -> Scoped:
        return Scoped(self, prefix)


def training_resolver() -> OpResolver:
    """Reference ops (they use the weights as given, so autograd reaches them), with fewer autograd nodes
    where an autograd-safe implementation exists: SDPA attention, torch's fused RMSNorm/LayerNorm."""
    records = [r for t in builtin_tables("reference") for r in load_table(t)]
    records += [Record(impl_id="sdpa", op_kind="attention", source="training"),
                Record(impl_id="sdpa", op_kind="attention", layer_role="vision_attn", source="training"),
                Record(impl_id="fast", op_kind="rms_norm", source="training"),
                Record(impl_id="fast", op_kind="layer_norm", source="training")]
    return OpResolver(Table(records), "cpu", "smolvla", lambda role: "prefill")


def vision_position_ids(vlm: VlmConfig, convention: str) -> torch.Tensor:
    """[grid^2] i64 position-embedding rows of the patch grid under ``convention`` (legacy/fixed)."""
    g = vlm.vision.grid
    return siglip.patch_position_ids(g, g, g, convention)


class TrainableSmolVLA(nn.Module):
    def __init__(self, cfg: SmolVLAConfig, vlm: VlmConfig, weights: dict[str, torch.Tensor],
                 vision_position_ids_convention: str = "legacy"):
        super().__init__()
        self.cfg, self.vlm_cfg = cfg, vlm
        self.keys = sorted(k for k in weights if k not in IGNORED_KEYS)
        self.names = {k: f"p{i}" for i, k in enumerate(self.keys)}  # ParameterDict names cannot hold dots
        self.params = nn.ParameterDict({self.names[k]: nn.Parameter(weights[k].detach().float().clone())
                                        for k in self.keys})
        src = ParamSource(self.params, self.names)
        self.model = SmolVLA(cfg, vlm, training_resolver(), src, vision_position_ids_convention)
        unused = sorted(set(self.keys) - src.used)
        if unused:
            raise CheckpointError(f"unexpected weight(s) not used by the model: {unused[:10]}")
        self.register_buffer("pos_ids", vision_position_ids(vlm, vision_position_ids_convention), persistent=False)
        self.extra = {k: weights[k].detach().float().clone() for k in weights if k in IGNORED_KEYS}

    def freeze(self, prefix: str) -> int:
        """Stop training every weight whose checkpoint name starts with ``prefix``; how many tensors (> 0)."""
        hit = [k for k in self.keys if k.startswith(prefix)]
        if not hit:
            raise ValueError(f"no weight starts with {prefix!r}")
        for k in hit:
            self.params[self.names[k]].requires_grad_(False)
        return len(hit)

    def state_dict_lerobot(self) -> dict[str, torch.Tensor]:
        """{checkpoint name: tensor}, every weight (IGNORED_KEYS such as lm_head carried through)."""
        out = {k: self.params[self.names[k]].detach().clone().contiguous() for k in self.keys}
        out.update({k: v.clone().contiguous() for k, v in self.extra.items()})
        return out

    def velocity(self, inp: ModelInputs, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """LeRobot's training forward up to v_t. x_t [B, C, A] noisy actions, t [B] times (or [B, C], one per
        action: training-time RTC) -> v_t [B, C, A]."""
        m, dev = self.model, x_t.device
        b, c = x_t.shape[:2]
        # the position-embedding gather reads the live parameter (the module's table is a build-time copy)
        m.vision.pos = self.params[self.names[VISION_POS_KEY]][self.pos_ids]
        ncam = len(inp.images)
        img = m.embed_images(torch.cat(inp.images))  # [ncam*B, T, H]
        n_img = img.shape[1]
        img = img.view(ncam, b, n_img, -1).transpose(0, 1).reshape(b, ncam * n_img, -1)
        prefix = torch.cat([img, m.embed_language(inp.lang_tokens), m.embed_state(inp.state)], dim=1)  # [B, P, H]
        p = prefix.shape[1]
        pad = torch.cat([torch.stack(inp.img_masks, 1).repeat_interleave(n_img, dim=1), inp.lang_masks.bool(),
                         torch.ones(b, 1 + c, dtype=torch.bool, device=dev)], dim=1)  # [B, P + C]
        # autoregressive blocks: images + language 0, state 1, each action token one more
        ar = torch.zeros(p + c, dtype=torch.long, device=dev)
        ar[p - 1:] = 1
        block = torch.cumsum(ar, dim=0)
        mask = (block[None, :] <= block[:, None])[None] & pad[:, None, :] & pad[:, :, None]  # [B, P+C, P+C]
        pos = torch.cumsum(pad, dim=1) - 1  # [B, P+C]
        layer0, e0 = m.text.layers[0], m.expert[0]
        kv = m.text.prefix_kv(prefix, layer0.rope.tables(pos[:, :p], layer0.head_dim), mask[:, :p, :p])
        contexts = [layer.context(*kv[i]) if layer.cross else kv[i] for i, layer in enumerate(m.expert)]
        sfx = pos[:, p:]
        rope_self = e0.rope.tables(sfx, e0.head_dim)
        rope_cross = e0.rope.tables(sfx - sfx.min(dim=1, keepdim=True).values, e0.head_dim)  # from 0, as LeRobot
        time_term = m.time_terms(t.reshape(-1)).view(b, -1, m.expert_hidden)  # [B, 1 or C, He]
        return m.velocity(x_t, time_term, contexts, rope_self, rope_cross, mask[:, p:, :], mask[:, p:, :p])
