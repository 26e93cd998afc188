"""EAGLE-3 style speculative decoding: draft head (``draft``), token trees (``tree``), speculative sampling
(``sampling``) and the decoder (``decoder``). Greedy output is token-for-token plain greedy; sampled output
follows the target's sampling distribution."""
from .decoder import SpeculativeDecoder, draft_tree, rank_accept
from .draft import (DRAFT_FORMAT, DraftConfig, DraftHead, build_draft, default_taps, draft_config_for,
                    draft_ops, init_draft_weights, load_draft, save_draft)
from .sampling import accept_among, residual, target_dist
from .tree import DEFAULT_RANK_ACCEPT, TreeShape, tree_mask, tree_positions

__all__ = ["DEFAULT_RANK_ACCEPT", "DRAFT_FORMAT", "DraftConfig", "DraftHead", "SpeculativeDecoder", "TreeShape",
           "accept_among", "build_draft", "default_taps", "draft_config_for", "draft_ops", "draft_tree",
           "init_draft_weights", "load_draft", "rank_accept", "residual", "save_draft", "target_dist", "tree_mask",
           "tree_positions"]
