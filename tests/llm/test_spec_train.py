"""Draft training: the collected data is the target's own continuation (greedy rows) and its own
distribution, and a few training steps cut the training-time-test loss."""
import torch

from edgefm_ros.generation.generate import SamplingConfig
from edgefm_ros.generation.speculative import build_draft, draft_config_for, draft_ops, init_draft_weights


def test_collect_is_the_targets_own_output(engine):
    from edgefm_ros.training.speculative_draft import collect, default_prompts

    cfg = draft_config_for(engine, 512, inner=64)
    prompts = default_prompts(4)
    data = collect(engine, prompts, 8, cfg.taps, batch=3, sampled_every=2, seed=int(torch.randint(0, 99, ())),
                   log=lambda s: None)
    assert data.tokens.shape[0] == 4 and data.taps.shape[-1] == len(cfg.taps) * cfg.text.hidden
    for r in (0, 2):  # greedy rows (1 and 3 are sampled)
        row = data.tokens[r][data.valid[r]].tolist()
        prompt = engine.encode(prompts[r])
        assert row[:len(prompt)] == prompt
        answer = engine.generate(prompt, SamplingConfig(max_new_tokens=8, stop_ids=())).tokens
        assert row[len(prompt):] == answer[:len(row) - len(prompt)]
        # soft labels: the target's distribution at each answer position, most likely first
        last, _ = engine.prefill(row[:-1], 0)
        p = torch.softmax(last, -1)
        col = data.tokens.shape[1] - 8 + len(row) - len(prompt) - 2
        assert int(data.top_ids[r, col, 0]) == int(p.argmax())
        assert torch.allclose(data.top_p[r, col], torch.topk(p, data.top_p.shape[-1]).values, atol=1e-4)
        assert bool((data.top_p[r, col][:-1] >= data.top_p[r, col][1:]).all())
    s = data.tokens[1][data.valid[1]].tolist()[len(engine.encode(prompts[1])):]
    assert len(s) >= 1  # sampled row carries a continuation too


def test_training_improves_the_draft(engine):
    from edgefm_ros.training.speculative_draft import collect, default_prompts, draft_losses, draft_vocabulary, train

    cfg = draft_config_for(engine, 512, inner=64)
    data = collect(engine, default_prompts(6), 10, cfg.taps, batch=6, log=lambda s: None)
    d2t = draft_vocabulary(data, cfg.draft_vocab, engine.eos_ids, cfg.target_vocab)
    t2d = torch.full((cfg.target_vocab,), -1, dtype=torch.long)
    t2d[d2t] = torch.arange(len(d2t))
    rows = data.rows(torch.arange(6))
    before = build_draft(cfg, init_draft_weights(cfg, engine.lm["decode"].token_embedding, d2t), draft_ops(engine))
    tensors, _ = train(engine, rows, cfg, d2t, steps=25, batch=3, lr=3e-3, log=lambda s: None, ttt_steps=2,
                       amp=False)
    after = build_draft(cfg, tensors, draft_ops(engine))
    with torch.no_grad():
        l0, _, _ = draft_losses(before, engine.lm["decode"].token_embedding, rows, t2d, steps=2)
        l1, acc, hist = draft_losses(after, engine.lm["decode"].token_embedding, rows, t2d, steps=2, ranks=3)
    assert l1 < 0.7 * l0
    assert hist.shape == (2, 3) and abs(float(hist[0, 0]) - acc[0]) < 1e-6  # rank 0 = top-1 accuracy
