"""Sequence to sequence: map a source string to a target string with an encoder-decoder.

    L = -(1/N) sum_{b,t: y_bt != pad} log p(y_{b,t} | y_{b,<t}, x_b)      teacher forcing

Batches are random (source, target) pairs padded to the longest in the batch (data/pairs.py). The
per-batch metrics are teacher-forced: ``token_accuracy`` (argmax = label) and ``exact_match`` (every
target token and the EOS right) — the latter equals greedy decoding's exact match, because greedy
decoding reproduces the target exactly iff every teacher-forced argmax is right. ``eval_report``
decodes for real (greedy and beam search), scores exact match, chrF and BLEU with sacrebleu, writes
the translations and a cross-attention alignment figure.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnlab.core.errors import DataError
from attnlab.core.extras import require
from attnlab.core.fileio import atomic_write_text, save_figure
from attnlab.data.pairs import SPECIALS, PairEncoder, load_pairs
from attnlab.nn.hooks import capture
from attnlab.training.tasks.base import Batch, Task, sample_rows

if TYPE_CHECKING:
    from attnlab.tokenizers import Tokenizer
    from attnlab.training.config import TrainConfig

SAMPLES = 10  # translations shown at the end of training


def build_pair_tokenizer(kind: str, texts: list[str], bpe_vocab_size: int) -> Tokenizer:
    """One tokenizer for both sides with PAD, BOS, EOS as ids 0, 1, 2."""
    from attnlab.tokenizers import BPETokenizer, CharTokenizer

    if kind == "char":
        chars = set("".join(texts)) - set(SPECIALS)
        return CharTokenizer([*SPECIALS, *sorted(chars)])
    return BPETokenizer.train(iter(texts), vocab_size=bpe_vocab_size, special_tokens=SPECIALS)


def translate(model: torch.nn.Module, encoder: PairEncoder, sources: list[str], beam_size: int = 1,
              alpha: float = 0.0, max_len: int | None = None, batch_size: int = 64) -> list[str]:
    """Decode ``sources`` (greedy for beam_size 1, else beam search) and return the target strings."""
    from attnlab.generation import beam_search, greedy_decode

    device = next(model.parameters()).device
    max_len = min(max_len or model.config.block_size, model.config.block_size)
    out: list[str] = []
    for i in range(0, len(sources), batch_size):
        src, mask = (t.to(device) for t in encoder.sources(sources[i : i + batch_size]))
        if beam_size == 1:
            decoded = greedy_decode(model, src, mask, encoder.bos_id, encoder.eos_id, max_len)
        else:
            decoded = beam_search(model, src, mask, encoder.bos_id, encoder.eos_id, max_len,
                                  beam_size=beam_size, alpha=alpha)
        out.extend(encoder.text(ids) for ids in decoded.tokens)
    return out


def score_translations(hypotheses: list[str], references: list[str], tokenize: str = "13a") -> dict[str, float]:
    """Exact match (fraction of identical strings), corpus chrF and BLEU (sacrebleu)."""
    sacrebleu = require("sacrebleu", "BLEU and chrF of seq2seq runs")
    exact = sum(h == r for h, r in zip(hypotheses, references)) / max(len(references), 1)
    return {
        "exact_match": exact,
        "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score,
        "bleu": sacrebleu.corpus_bleu(hypotheses, [references], tokenize=tokenize).score,
    }


class Seq2SeqTask(Task):
    """Pairs from a built-in generated task, the Bible, or a TSV/JSONL file; char or BPE tokenizer."""

    unit = "tokens"
    splits = ("train", "val", "test")

    def __init__(self, cfg: TrainConfig, assets: Path | None = None, world_size: int = 1) -> None:
        from attnlab.tokenizers import load_tokenizer

        super().__init__(cfg, assets, world_size)
        require("sacrebleu", "BLEU and chrF of seq2seq runs")  # before any work, not at the first evaluation
        self.pairs = load_pairs(cfg.data, cfg.seq2seq, cfg.seed, cfg.val_fraction)
        if (pretrained := self.tokenizer_source(assets)) is not None:
            self.tokenizer = load_tokenizer(pretrained)
        else:  # the char vocabulary covers every split, so evaluation never meets an unknown character
            every = self.pairs.train + self.pairs.val + self.pairs.test
            texts = [s for p in every for s in p] if cfg.tokenizer == "char" else \
                [s for p in self.pairs.train for s in p]
            self.tokenizer = build_pair_tokenizer(cfg.tokenizer, texts, cfg.bpe_vocab_size)
        self.encoder = PairEncoder(self.tokenizer, cfg.model.block_size)
        n = len(self.pairs.train)
        self.pairs.train = [p for p in self.pairs.train if self.encoder.fits(p)]
        self.dropped = n - len(self.pairs.train)  # training pairs longer than the context
        if not self.pairs.train:
            raise DataError(f"no training pair fits model.block_size={cfg.model.block_size} tokens; raise it")
        if len(self.pairs.train) < world_size:
            raise DataError(f"{len(self.pairs.train)} training pairs cannot be shared by {world_size} processes")
        cfg.model.vocab_size = self.tokenizer.vocab_size

    # -- batches -----------------------------------------------------------------------------------

    def batch(self, split: str, batch_size: int, generator: torch.Generator,
              shard: tuple[int, int] = (0, 1)) -> Batch:
        pairs = self.pairs.split(split)
        idx = sample_rows(len(pairs), batch_size, generator, shard).tolist()
        return self.encoder.batch([pairs[i] for i in idx])

    def eval_batches(self, split: str, batch_size: int, n_batches: int, seed: int) -> Iterator[Batch]:
        """val and test: every pair once, in order (up to n_decode); train: random batches."""
        if split == "train":
            yield from super().eval_batches(split, batch_size, n_batches, seed)
            return
        pairs = self.pairs.split(split)[: self.cfg.seq2seq.n_decode]
        for i in range(0, len(pairs), batch_size):
            yield self.encoder.batch(pairs[i : i + batch_size])

    def count(self, batch: Batch) -> int:
        return batch["src_ids"].numel() + batch["tgt_in"].numel()

    def metrics(self, out: Any, batch: Batch) -> dict[str, Tensor]:
        labels = batch["labels"]  # (B, T)
        real = labels != -100
        right = (out.logits.argmax(dim=-1) == labels) & real  # (B, T)
        return {
            "token_accuracy": right.sum() / real.sum().clamp(min=1),
            "exact_match": (right | ~real).all(dim=1).float().mean(),
        }

    def save(self, folder: Path) -> None:
        self.tokenizer.save(folder)

    # -- decoding reports --------------------------------------------------------------------------

    @property
    def bleu_tokenize(self) -> str:
        """sacrebleu's tokenizer for this data (13a, or char for Japanese)."""
        return "char" if self.cfg.data == "bible-en-ja" else "13a"  # no word boundaries in Japanese

    def decode_split(self, model: torch.nn.Module, split: str) -> dict[str, Any]:
        """Greedy and beam-search translations of (up to n_decode pairs of) a split, with their scores."""
        opts = self.cfg.seq2seq
        pairs = self.pairs.split(split)[: opts.n_decode]
        sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
        greedy = translate(model, self.encoder, sources)
        result: dict[str, Any] = {"n": len(pairs), "greedy": score_translations(greedy, refs, self.bleu_tokenize),
                                  "translations": {"source": sources, "reference": refs, "greedy": greedy}}
        if opts.beam_size > 1:
            beam = translate(model, self.encoder, sources, opts.beam_size, opts.length_penalty)
            result["beam"] = score_translations(beam, refs, self.bleu_tokenize)
            result["beam"]["beam_size"], result["beam"]["length_penalty"] = opts.beam_size, opts.length_penalty
            # pairs greedy got right and beam search got wrong (the done-when asks for none)
            result["beam_worse_than_greedy"] = sum(g == r != b for g, b, r in zip(greedy, beam, refs))
            result["translations"]["beam"] = beam
        return result

    def eval_report(self, model: torch.nn.Module, run_dir: Path) -> list[Path]:
        """Decode the test split (held out); print and write exact match / chrF / BLEU, the translations
        and a cross-attention alignment figure."""
        from attnlab.core.fileio import atomic_write_text

        report: dict[str, Any] = {"data": self.cfg.data}
        paths = []
        for split in ("test",):
            result = self.decode_split(model, split)
            for how in ("greedy", "beam"):
                if how in result:
                    s = result[how]
                    print(f"{split:>5} {how:>6}: exact match {s['exact_match']:.4f}  chrF {s['chrf']:.2f}  "
                          f"BLEU {s['bleu']:.2f}  ({result['n']} pairs)")
            if "beam_worse_than_greedy" in result:
                print(f"{split:>5} pairs greedy got right and beam got wrong: {result['beam_worse_than_greedy']}")
            tr = result.pop("translations")
            lines = []
            for i in range(len(tr["source"])):
                beam = f"beam:      {tr['beam'][i]}\n" if "beam" in tr else ""
                lines.append(f"source:    {tr['source'][i]}\nreference: {tr['reference'][i]}\n"
                             f"greedy:    {tr['greedy'][i]}\n{beam}")
            path = run_dir / f"translations_{split}.txt"
            atomic_write_text(path, "\n".join(lines))
            paths.append(path)
            report[split] = result
        path = run_dir / "translation_eval.json"
        atomic_write_text(path, json.dumps(report, indent=2))
        paths.append(path)
        source = self.pairs.test[0][0]
        paths.append(plot_cross_attention(model, self.encoder, source, run_dir / "cross_attention.png"))
        return paths

    def write_samples(self, model: torch.nn.Module, run_dir: Path) -> str | None:
        """Translate the first SAMPLES test sources beside their references; none with sample_tokens=0."""
        if self.cfg.sample_tokens <= 0:
            return None
        pairs = self.pairs.test[:SAMPLES]
        outs = translate(model, self.encoder, [s for s, _ in pairs])
        text = "\n".join(f"{s}  ->  {o}   (reference: {t})" for (s, t), o in zip(pairs, outs))
        atomic_write_text(run_dir / "samples.txt", text + "\n")
        return text


# ------------------------------------------------------------------------------------- the figure


def token_labels(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """A label per token: the text it completes (a byte-level BPE token may hold half a character), control
    characters written as escapes ("\\n", "\\x02": a character tokenizer's specials are such), which no font draws."""
    labels, shown = [], ""
    for i in range(len(ids)):
        text = tokenizer.decode(ids[: i + 1])
        text = text[: len(text) - 1] if text.endswith("\ufffd") else text
        labels.append(text[len(shown):] if text.startswith(shown) else tokenizer.decode([ids[i]]))
        shown = text if text.startswith(shown) else shown
    return ["".join(c.encode("unicode_escape").decode("ascii") if unicodedata.category(c) == "Cc" else c for c in lab)
            for lab in labels]


def _cjk_font() -> str | None:
    """A font file with Japanese glyphs, if one is installed (matplotlib's defaults have none)."""
    import importlib.util

    from matplotlib import font_manager

    for f in font_manager.fontManager.ttflist:
        if any(k in f.name for k in ("CJK", "IPA", "Gothic", "Mincho")):
            return f.fname
    spec = importlib.util.find_spec("japanize_matplotlib")  # ships the IPAex Gothic font; not imported
    if spec is not None and spec.submodule_search_locations:
        font = Path(next(iter(spec.submodule_search_locations))) / "fonts" / "ipaexg.ttf"
        if font.is_file():
            return str(font)
    return None


@torch.no_grad()
def plot_cross_attention(model: torch.nn.Module, encoder: PairEncoder, source: str, path: Path) -> Path:
    """Greedy-translate ``source`` and draw the cross-attention of each target token to the source
    tokens (last decoder layer, mean over heads): a target x source heatmap whose rows sum to 1."""
    from matplotlib import font_manager
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # not pyplot's: a notebook keeps its own backend

    from attnlab.generation import greedy_decode

    device = next(model.parameters()).device
    src, mask = (t.to(device) for t in encoder.sources([source]))
    out = greedy_decode(model, src, mask, encoder.bos_id, encoder.eos_id, model.config.block_size - 1)
    target = out.tokens[0]
    tgt_in = torch.tensor([[encoder.bos_id, *target]], device=device)  # the row for step t predicts y_t
    last = f"decoder.{len(model.decoder) - 1}.cross_attn.hook_pattern"
    with capture(model, last) as seen:
        model(src, tgt_in, src_mask=mask)
    probs = seen[last][0].mean(0)  # (B, H, T, S) -> (T, S), the last layer's heads averaged
    tok = encoder.tokenizer
    src_labels = token_labels(tok, src[0].tolist())
    tgt_labels = [*token_labels(tok, target), "</s>"]
    font = _cjk_font()
    prop = font_manager.FontProperties(fname=font) if font else None
    T, S = probs.shape
    fig = Figure(figsize=(max(4.0, 0.32 * S + 2), max(3.0, 0.28 * T + 1.5)))
    FigureCanvasAgg(fig)  # drawn and measured by Agg, as the PNG is written
    ax = fig.subplots()
    ax.imshow(probs.float().cpu().numpy(), cmap="viridis", aspect="auto", vmin=0.0)
    ax.set_xticks(range(S), src_labels, rotation=90, fontproperties=prop, fontsize=8)
    ax.set_yticks(range(T), tgt_labels, fontsize=8)
    ax.set_xlabel("source token")
    ax.set_ylabel("generated target token")
    ax.set_title("cross-attention (last decoder layer, mean over heads)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=120)
    return path
