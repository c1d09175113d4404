"""The generation options transformers users expect, checked against transformers itself: its logits
processors on the same logits, and its ``generate`` on attnlab's exported weights (greedy with a
repetition penalty, beam search, stop strings); the Python API's prompt cropping and attention."""

from __future__ import annotations

import pytest
import torch

from attnlab.cli import main
from attnlab.core.errors import ConfigError
from attnlab.generation import SamplingConfig, filter_logits, generate, repetition_penalty
from tests.helpers import train_tiny_run

transformers = pytest.importorskip("transformers")
from transformers import generation as hf_generation  # noqa: E402


def test_the_processors_equal_transformers_on_the_same_logits():
    torch.manual_seed(0)
    logits, seq = torch.randn(4, 50) * 3, torch.randint(0, 50, (4, 12))
    hf = hf_generation.LogitsProcessorList([
        hf_generation.RepetitionPenaltyLogitsProcessor(1.3), hf_generation.TemperatureLogitsWarper(0.7),
        hf_generation.TopKLogitsWarper(20), hf_generation.TopPLogitsWarper(0.9), hf_generation.MinPLogitsWarper(0.05),
    ])(seq, logits.clone())
    ours = filter_logits(repetition_penalty(logits, seq, 1.3) / 0.7, top_k=20, top_p=0.9, min_p=0.05)
    assert torch.equal(torch.isinf(ours), torch.isinf(hf))
    torch.testing.assert_close(ours[~torch.isinf(ours)], hf[~torch.isinf(hf)])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gen")
    run = train_tiny_run(tmp, max_iters=30, block_size=48, **{"model.positions": "learned"})
    assert main(["export", str(run), "--out", str(tmp / "hf")]) == 0
    transformers.logging.set_verbosity_error()
    return run, transformers.AutoModelForCausalLM.from_pretrained(tmp / "hf").eval(), tmp / "hf"


@pytest.mark.parametrize("options, theirs", [
    (dict(temperature=0, repetition_penalty=1.5), dict(do_sample=False, repetition_penalty=1.5)),
    (dict(num_beams=3), dict(do_sample=False, num_beams=3, length_penalty=1.0, early_stopping=False)),
])
def test_generate_equals_transformers_generate_on_the_exported_weights(exported, options, theirs):
    import attnlab

    run, hf, _ = exported
    lm = attnlab.load(run)
    prompt = torch.tensor([lm.tokenizer.encode("the quick brown ")])
    mine = generate(lm.model, prompt, SamplingConfig(max_new_tokens=12, **options))
    reference = hf.generate(prompt, max_new_tokens=12, min_new_tokens=12, pad_token_id=0, **theirs)
    assert mine.tolist() == reference.tolist()


def test_stop_strings_end_the_text_where_transformers_stops(exported):
    import attnlab

    run, hf, folder = exported
    lm = attnlab.load(run)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    prompt = "the quick "
    text = lm.generate(prompt, max_new_tokens=40, temperature=0, stop=["e", " "])
    reference = hf.generate(torch.tensor([tok(prompt)["input_ids"]]), max_new_tokens=40, do_sample=False,
                            stop_strings=["e", " "], tokenizer=tok, pad_token_id=0)
    assert text == tok.decode(reference[0]) and text[len(prompt):][-1] in "e "
    with pytest.raises(ConfigError, match="stop string must be non-empty"):  # "" is in every text
        lm.generate(prompt, max_new_tokens=5, stop=["e", ""])
    with pytest.raises(ConfigError, match="use fewer beams"):  # 10^8 beams are one batch: refused before it
        lm.generate(prompt, max_new_tokens=5, num_beams=10**8)


def test_a_prompt_longer_than_the_context_is_cropped_with_a_notice(exported, capsys):
    import attnlab

    lm = attnlab.load(exported[0])
    block = lm.model.config.block_size
    long = "the quick brown fox jumps. " * (block // 5)
    out = lm.generate(long, max_new_tokens=5, temperature=0)
    assert out.startswith(long) and len(out) == len(long) + 5
    assert "generating from its last" in capsys.readouterr().err
    patterns = lm.attention("the fox")
    assert len(patterns) == lm.model.config.n_layer and patterns[0].shape[-1] == 7
    torch.testing.assert_close(patterns[0].sum(-1), torch.ones_like(patterns[0].sum(-1)))


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=float("nan")), "temperature must be a finite number"),  # torch's multinomial raised
    (dict(top_p=float("nan")), "top_p must be a finite number"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty must be a finite number"),
    (dict(max_new_tokens=2.5), "max_new_tokens must be an integer"),
    (dict(top_k=True), "top_k must be an integer"),
])
def test_the_api_refuses_non_finite_and_non_integer_options_before_generating(exported, kwargs, message):
    import attnlab

    with pytest.raises(ConfigError, match=message):
        attnlab.load(exported[0]).generate("the", **kwargs)


@pytest.mark.parametrize("prompt", [123, None, ["the", 3]])
def test_the_api_refuses_a_prompt_that_is_not_a_string(exported, prompt):
    import attnlab

    # a list is a batch of prompts (tests/test_api.py); anything else was encoded as if it were text
    with pytest.raises(ConfigError, match=r"expected the (text|prompts) as a str"):
        attnlab.load(exported[0]).generate(prompt)
