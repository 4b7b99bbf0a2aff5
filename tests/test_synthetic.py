"""Synthetic GGUF models (pyminfer/synthetic.py, ``pyminfer synth``): the Q4_K_M layout of the real
files, a file our loader, tokenizer and forward accept, and the draft-vocabulary gate with the real 0.5B."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from pyminfer import synthetic as syn

SMALL = dict(n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64, n_vocab=152064)


def test_plan_of_the_1_5b_has_the_real_files_type_counts():
    """../shared/models/MODELS.md: Q4_K x169, Q6_K x29 (output, attn_v / ffn_down on half the
    layers), F32 x141."""
    c = Counter(t for _, t, _, _, _ in syn.tensor_plan(syn.SHAPES["1.5b"]))
    assert c == {syn.Q4_K: 169, syn.Q6_K: 29, syn.F32: 141}


@pytest.mark.parametrize("shape,gb", [("7b", 4.68), ("14b", 8.99)])
def test_plan_sizes_match_the_anchor_files(shape, gb):
    """The 7B/14B synthetic files llama.cpp was measured on (../shared/anchors) are 4.68 / 8.99 GB."""
    n = sum(r * syn.row_bytes(t, c) for _, t, r, c, _ in syn.tensor_plan(syn.SHAPES[shape]))
    assert abs(n / 1e9 - gb) / gb < 0.005, n


def test_more_bits_is_half_the_layers():
    for n in (24, 28, 48):
        assert sum(syn.q4_k_m_more_bits(n)) == n // 2


def test_written_file_loads_runs_and_passes_the_draft_gate(tmp_path, qwen05_path):
    from pyminfer.engine import Model
    from pyminfer.spec import check_vocab_compat

    p = tmp_path / "small.gguf"
    n = syn.write_synthetic_gguf(p, SMALL, qwen05_path, seed=3)
    assert n == sum(r * syn.row_bytes(t, c) for _, t, r, c, _ in syn.tensor_plan(SMALL))
    with Model(p, device="cpu", n_ctx=64) as m, Model(qwen05_path, device="cpu", n_ctx=64) as d:
        cfg = m.config
        assert (cfg.arch, cfg.n_layer, cfg.n_embd, cfg.n_ff, cfg.n_head, cfg.n_head_kv, cfg.n_vocab) == \
            ("qwen2", 2, 256, 512, 4, 2, 152064)
        assert cfg.qkv_bias and not cfg.tied_embeddings
        # the vocabulary is padded to n_vocab as llama.cpp pads Qwen2.5-7B/14B; the draft gate accepts it
        assert m.tokenizer.n_vocab == 152064 and d.tokenizer.n_vocab == 151936
        assert m.tokenizer.token_text(152063) == "[PAD152063]"
        check_vocab_compat(m.tokenizer, d.tokenizer)
        ids = m.tokenizer.encode("def f(x):\n    return x")
        assert ids == d.tokenizer.encode("def f(x):\n    return x")
        lg = m.prefill(ids, 0)
        assert np.isfinite(lg).all() and lg.std() > 0.1


def test_bad_arguments_are_refused(tmp_path, qwen05_path):
    with pytest.raises(ValueError, match="unknown shape"):
        syn.write_synthetic_gguf(tmp_path / "x.gguf", "3b", qwen05_path)
    with pytest.raises(ValueError, match="n_layer"):
        syn.write_synthetic_gguf(tmp_path / "x.gguf", "1.5b", qwen05_path, n_layer=29)
    with pytest.raises(ValueError, match="multiples of 256"):
        syn.write_synthetic_gguf(tmp_path / "x.gguf", dict(SMALL, n_embd=100), qwen05_path)
    with pytest.raises(ValueError, match="more than the shape's n_vocab"):
        syn.write_synthetic_gguf(tmp_path / "x.gguf", dict(SMALL, n_vocab=1024), qwen05_path)
    with pytest.raises(FileNotFoundError):
        syn.write_synthetic_gguf(tmp_path / "x.gguf", SMALL, tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match="seed"):
        syn.write_synthetic_gguf(tmp_path / "x.gguf", SMALL, qwen05_path, seed=-1)
    with pytest.raises(ValueError, match="not a regular file"):
        syn.write_synthetic_gguf(tmp_path, SMALL, qwen05_path)
    with pytest.raises(ValueError, match="overwrite the tokenizer source"):
        syn.write_synthetic_gguf(qwen05_path, SMALL, qwen05_path)
    with pytest.raises(FileNotFoundError, match="^output directory not found: .*nowhere$"):
        syn.write_synthetic_gguf(tmp_path / "nowhere" / "x.gguf", SMALL, qwen05_path)
    assert not list(tmp_path.iterdir())  # nothing written by a refused call


def test_not_a_qwen2_vocabulary_is_refused(tmp_path, smol_path):
    with pytest.raises(ValueError, match="not a Qwen2 vocabulary"):
        syn.write_synthetic_gguf(tmp_path / "x.gguf", SMALL, smol_path)


def test_interrupted_write_leaves_the_old_file_and_no_partial(tmp_path, qwen05_path):
    p = tmp_path / "m.gguf"
    p.write_bytes(b"old")

    def stop(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        syn.write_synthetic_gguf(p, SMALL, qwen05_path, progress=stop)
    assert p.read_bytes() == b"old" and sorted(x.name for x in tmp_path.iterdir()) == ["m.gguf"]


def test_cli_synth(tmp_path, qwen05_path, capsys):
    from pyminfer.cli import main
    from pyminfer.gguf_model import GGUFModel

    out = tmp_path / "s.gguf"
    assert main(["synth", "--shape", "1.5b", "--n-layer", "1", "-o", str(out), "-q",
                 "--tokenizer-from", str(qwen05_path)]) == 0
    assert "qwen2.5-1.5b shape" in capsys.readouterr().err
    g = GGUFModel(out)
    assert g.config.n_layer == 1 and g.config.n_embd == 1536 and g.config.n_vocab == 151936
    assert g.tensors["blk.0.ffn_down.weight"][1] == syn.Q6_K  # q4_k_m_more_bits(1) == [True]
    assert main(["synth", "--shape", "1.5b", "--n-layer", "0", "-o", str(out), "-q",
                 "--tokenizer-from", str(qwen05_path)]) == 1


@pytest.mark.slow
def test_1_5b_layout_equals_the_real_file(tmp_path, qwen05_path, qwen15_path):
    """Every tensor's name, type and shape as in the real Qwen2.5-Coder-1.5B-Instruct Q4_K_M file."""
    from gguf import GGUFReader

    p = tmp_path / "s15.gguf"
    syn.write_synthetic_gguf(p, "1.5b", qwen05_path)

    def layout(path):
        return {t.name: (int(t.tensor_type), [int(x) for x in t.shape]) for t in GGUFReader(path).tensors}

    assert layout(p) == layout(qwen15_path)
