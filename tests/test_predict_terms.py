# bench/predict.predict's terms for a grouped-query model, against formulas written out here: the
# frozen weights counted by hand from the config.json fields at 2 bytes (bfloat16, and dtype='auto',
# which is bfloat16 on the hardware such a prediction is for) or 4 (float32); the sampling pass's KV
# cache only n_kv_head / n_head as wide as the queries (Qwen2's 2 of 12 heads: a sixth).
# Run: python -m pytest -q tests/test_predict_terms.py
import json

import pytest

from bench import predict

C, INNER, LAYERS, HEADS, KV_HEADS, V = 64, 96, 3, 8, 2, 300
FIELDS = dict(model_type="qwen2", hidden_size=C, intermediate_size=INNER, num_hidden_layers=LAYERS,
              num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=V,
              max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-6,
              tie_word_embeddings=True, hidden_act="silu")
BATCH, GROUP, PROMPT, NEW = 2, 4, 20, 30


def cfg(tmp_path, dtype, **kw):
    (tmp_path / "config.json").write_text(json.dumps(FIELDS))
    return dict(base_ckpt=str(tmp_path), lora_r=4, lora_alpha=8, lora_targets=("q_proj", "v_proj"),
                dtype=dtype, batch_size=BATCH, group_size=GROUP, max_new_tokens=NEW,
                micro_batch_size=0, grad_checkpoint=False, device="cuda", **kw)


def base_params():
    """Qwen2 by hand: tied embedding; per layer q, k, v with biases, o, gate, up, down, 2 norms."""
    kv = C // HEADS * KV_HEADS
    layer = (C * C + C) + 2 * (C * kv + kv) + C * C + 3 * C * INNER + 2 * C
    return V * C + LAYERS * layer + C


def sampling_bytes(b):
    """The KV cache of every row (keys and values, every layer and column, at the key/value heads'
    width), its copy while the prefill is shared out to the group, and one step's logits, float copy
    and probs."""
    N, S, kv = BATCH * GROUP, PROMPT + NEW, C // HEADS * KV_HEADS
    cache = 2 * LAYERS * N * S * kv * b
    return cache * (1 + 1 / GROUP) + 3 * N * V * 4


@pytest.mark.parametrize("dtype, b", [("bfloat16", 2), ("auto", 2), ("float32", 4)])
def test_weights_and_grouped_query_kv_cache_by_hand(tmp_path, dtype, b):
    r, args, _ = predict.predict(cfg(tmp_path, dtype), PROMPT)
    assert (args["n_head"], args["n_kv_head"]) == (HEADS, KV_HEADS)
    assert r["n_base"] == base_params()
    assert r["weights"] == base_params() * b
    assert r["passes"]["sampling"] == pytest.approx(sampling_bytes(b), rel=1e-12)


def test_auto_is_counted_as_bfloat16(tmp_path):
    """On a CUDA device (the configs' own) 'auto' is bf16, as scale/device resolves it there."""
    auto, _, _ = predict.predict(cfg(tmp_path, "auto"), PROMPT)
    bf16, _, _ = predict.predict(cfg(tmp_path, "bfloat16"), PROMPT)
    f32, _, _ = predict.predict(cfg(tmp_path, "float32"), PROMPT)
    assert {k: auto[k] for k in ("weights", "lora", "step", "total")} == \
           {k: bf16[k] for k in ("weights", "lora", "step", "total")}
    assert auto["total"] < f32["total"]


def test_fewer_key_value_heads_give_a_smaller_cache(tmp_path):
    """The same model with a key/value head per query head: the cache grows HEADS / KV_HEADS."""
    gqa, _, _ = predict.predict(cfg(tmp_path, "bfloat16"), PROMPT)
    (tmp_path / "mha").mkdir()
    mha_fields = {**FIELDS, "num_key_value_heads": HEADS}
    (tmp_path / "mha" / "config.json").write_text(json.dumps(mha_fields))
    mha, _, _ = predict.predict({**cfg(tmp_path, "bfloat16"), "base_ckpt": str(tmp_path / "mha")},
                                PROMPT)
    logits = 3 * BATCH * GROUP * V * 4
    cache_gqa, cache_mha = (r["passes"]["sampling"] - logits for r in (gqa, mha))
    assert cache_mha == pytest.approx(cache_gqa * HEADS / KV_HEADS)
