"""Generation: sampling and beam search for decoder-only models (``sampling.py``, ``processors.py``,
``beam.py``), greedy and beam decoding for encoder-decoders (``seq2seq.py``)."""

from attnlab.generation.beam import beam_generate
from attnlab.generation.processors import filter_logits, repetition_penalty
from attnlab.generation.sampling import SamplingConfig, compiled_decode_step, generate, next_token, stream
from attnlab.generation.seq2seq import Decoded, beam_search, greedy_decode, length_penalty

__all__ = ["Decoded", "SamplingConfig", "beam_generate", "beam_search", "compiled_decode_step", "filter_logits",
           "generate", "greedy_decode", "length_penalty", "next_token", "repetition_penalty", "stream"]
