"""TrainConfig: everything a run needs besides the architecture (which is ``model:``)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Literal

from attnlab.core.errors import ConfigError
from attnlab.cpu import parse_kernels
from attnlab.data.pairs import Seq2SeqOptions
from attnlab.models.config import ModelConfig
from attnlab.models.gpt.config import GPTConfig
from attnlab.nn.attention.kernels import check_route
from attnlab.training.tasks.names import SECTIONS, TASK_SECTIONS, TOKENIZED, check_family, check_head, task_name


@dataclass
class ImageOptions:
    """Image classification data (task image-classification): split, augmentation, size handling."""

    shift: int = 2  # random shift of up to this many pixels (zero padding, then crop); 0 = none
    flip: bool = False  # random horizontal flip (off for digits and text-like images)
    test_fraction: float = 0.2  # held out as test when the data has no official test split
    train_fraction: float = 1.0  # train on a class-balanced fraction of the training split
    split_seed: int = 0  # the fixed seed of the train/val/test split and of the train_fraction subset
    resize: bool = False  # folder data: resize images of another size (else they are refused)
    n_generated: int = 6000  # data=generated:micrograph...: images drawn (then split train/val/test)
    data_seed: int = 0  # data=generated:micrograph...: the generator's seed (the split has its own)
    n_local_crops: int = 4  # task dino: local views per image (besides the two global ones)

    def validate(self) -> None:
        """Range checks of the image options; ConfigError naming the option."""
        if self.shift < 0:
            raise ConfigError(f"'images.shift' must be >= 0, got {self.shift}")
        if not 20 <= self.n_generated <= 1_000_000:
            raise ConfigError(f"'images.n_generated' must be in [20, 1000000], got {self.n_generated}")
        if not 0 <= self.data_seed < 2**63:
            raise ConfigError(f"'images.data_seed' must be >= 0, got {self.data_seed}")
        if not 0 <= self.n_local_crops <= 16:
            raise ConfigError(f"'images.n_local_crops' must be in [0, 16], got {self.n_local_crops}")
        for key in ("test_fraction", "train_fraction"):
            value = getattr(self, key)
            if not 0.0 < value <= (1.0 if key == "train_fraction" else 0.9):
                raise ConfigError(f"'images.{key}' must be in (0, {1 if key == 'train_fraction' else 0.9}], "
                                  f"got {value}")


@dataclass
class ProbeOptions:
    """``attnlab probe RUN_DIR key=value...``: a linear probe on frozen encoder features."""

    data: str = ""  # text: .csv / .tsv (text,label) or .jsonl; image runs: any image source (data/images.py)
    # the feature per input: the mean of the encoder's output tokens, or its [CLS]
    pooling: Literal["mean", "cls"] = "mean"
    test_fraction: float = 0.2  # share of the rows held out to score the probe
    seed: int = 0  # the seed of the held-out split and of the probe's fit
    max_len: int = 128  # text: tokens per input, longer texts cut
    kind: Literal["auto", "logistic", "ridge"] = "auto"  # logistic or ridge; auto: ridge when every label is a number
    n_labels: int | None = None  # image runs: train the probe on this many labelled images (class-balanced)

    def validate(self) -> None:
        """Range checks of the probe options; ConfigError naming the option."""
        if not self.data:
            raise ConfigError("probe needs data=FILE (.csv with text,label columns, or .jsonl)")
        if not 0.0 < self.test_fraction < 1.0:
            raise ConfigError(f"test_fraction must be in (0, 1), got {self.test_fraction}")
        if self.max_len < 3:
            raise ConfigError(f"max_len must be >= 3, got {self.max_len}")
        if self.n_labels is not None and self.n_labels < 2:
            raise ConfigError(f"n_labels must be >= 2, got {self.n_labels}")


@dataclass
class MLMOptions:
    """Task "mlm" (BERT pre-training): ``mlm.mask_prob=0.15 mlm.nsp=true ...``."""

    mask_prob: float = 0.15  # share of non-special tokens selected for prediction
    mask_token_prob: float = 0.8  # of the selected: replaced by [MASK]
    random_token_prob: float = 0.1  # of the selected: replaced by a random token (the rest stay unchanged)
    nsp: bool = False  # next-sentence prediction as a second objective
    max_len: int | None = None  # tokens per example, [CLS]/[SEP] included; None = model.block_size

    def validate(self) -> None:
        """Range checks of the masking options; ConfigError naming the option."""
        if not 0.0 < self.mask_prob < 1.0:
            raise ConfigError(f"mlm.mask_prob must be in (0, 1), got {self.mask_prob}")
        if min(self.mask_token_prob, self.random_token_prob) < 0 or self.mask_token_prob + self.random_token_prob > 1:
            raise ConfigError("mlm.mask_token_prob and mlm.random_token_prob must be >= 0 and sum to <= 1")
        if self.max_len is not None and self.max_len < (5 if self.nsp else 3):
            raise ConfigError(f"mlm.max_len must be >= {5 if self.nsp else 3} (room for [CLS], [SEP] and text)")


@dataclass
class ClassifyOptions:
    """Task "classify" (text, label rows): ``classify.test_fraction=0.2 classify.init_from=RUN ...``."""

    test_fraction: float = 0.2  # held out (split "val"), never trained on
    split_seed: int = 0  # the held-out rows depend on this seed only
    max_len: int | None = None  # tokens per text; None = model.block_size
    init_from: str | None = None  # a model folder whose tokenizer (and, via attnlab finetune, encoder) start the run

    def validate(self) -> None:
        """Range checks of the classification options; ConfigError naming the option."""
        if not 0.0 < self.test_fraction < 1.0:
            raise ConfigError(f"classify.test_fraction must be in (0, 1), got {self.test_fraction}")
        if self.max_len is not None and self.max_len < 3:
            raise ConfigError(f"classify.max_len must be >= 3, got {self.max_len}")


@dataclass
class ContinuousOptions:
    """Task "continuous" (encoder family: feature sequences or sets): ``continuous.target=y ...``."""

    target: str = "target"  # CSV: the target column
    test_fraction: float = 0.2  # held out (split "val"), never trained on
    split_seed: int = 0  # the held-out rows depend on this seed only
    n_generated: int = 4000  # data=generated:...: examples generated
    data_seed: int = 0  # data=generated:...: the generator's seed (fixes the interaction matrix too)
    audio_seconds: float = 1.0  # audio: clips centre-cropped or padded to this length
    n_mels: int = 40  # audio: mel bands per 10 ms frame

    def validate(self) -> None:
        """Range checks of the feature/set options; ConfigError naming the option."""
        if not 0.0 < self.test_fraction < 1.0:
            raise ConfigError(f"continuous.test_fraction must be in (0, 1), got {self.test_fraction}")
        if self.n_generated < 10:
            raise ConfigError(f"continuous.n_generated must be >= 10, got {self.n_generated}")
        if self.data_seed < 0:
            raise ConfigError(f"continuous.data_seed must be >= 0, got {self.data_seed}")
        if not 0.1 <= self.audio_seconds <= 30:
            raise ConfigError(f"continuous.audio_seconds must be in [0.1, 30], got {self.audio_seconds}")
        if not 8 <= self.n_mels <= 128:
            raise ConfigError(f"continuous.n_mels must be in [8, 128], got {self.n_mels}")


# the spellings of TrainConfig.device (and of ``attnlab sample --device``)
DEVICE_SPEC = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


MAX_VOCAB = 2**20  # a learned vocabulary's largest size (large LLM vocabularies are ~100k-260k)
BPE_MIN_VOCAB = 257  # a byte-level BPE's smallest: 256 bytes and one special token (tokenizers.bpe)
# the largest counts a run takes (TrainConfig.check_sizes): beyond them a run never finishes
MAX_EVAL_ITERS = 100_000  # batches per evaluation
MAX_EVAL_TOKENS = 10**9  # tokens per evaluation: eval_iters x eval batch x block_size
MAX_SAMPLE_TOKENS = 100_000  # tokens sampled at the end of a run
MAX_PROFILE_STEPS = 1000  # steps recorded by the profiler (a trace of each is kept in memory)
MAX_NAME_BYTES = 255  # a folder name (NAME_MAX of Linux, macOS and Windows file systems)


@dataclass
class TrainConfig:
    """A run: data, tokenizer, optimisation, evaluation, logging. YAML presets: attnlab/presets/."""

    name: str | None = None  # run folder name; default: preset name + timestamp
    out_dir: str = "runs"  # the folder the run folder is made in: OUT_DIR/NAME (runs/latest: its newest)
    # what is trained (training/tasks/): None = the model family's default (gpt: lm)
    task: str | None = None
    data: str = "shakespeare"  # a text file, or a built-in corpus: "shakespeare", "repeated" (no download)
    tokenizer: Literal["char", "bpe", "wordpiece"] = "char"  # characters, byte-level BPE or WordPiece (bpe_vocab_size)
    # a run or model folder of the same family: its weights start this run (every tensor whose name and shape
    # fit; a head of another size starts fresh) and its tokenizer is used; resume=true takes precedence
    init_from: str | None = None
    bpe_vocab_size: int = 1024  # tokenizer=bpe or wordpiece: the vocabulary size learnt from the training text
    val_fraction: float = 0.1  # share of the data held out as the val split (text: its last part)
    # optimisation
    batch_size: int = 12  # examples (sequences, images, rows) per micro-batch; a step takes grad_accum of them
    grad_accum: int = 1  # micro-batches per optimiser step, their gradients summed before the update
    max_iters: int = 2000  # optimiser steps in all; a run is finished when it reaches them
    lr: float = 1e-3  # peak learning rate, reached after warmup_iters
    min_lr: float = 1e-4  # the learning rate at the end of the schedule (lr_decay_iters)
    warmup_iters: int = 100  # steps of linear warmup from 0 to lr
    lr_decay_iters: int | None = None  # the step where the rate reaches min_lr; None = max_iters
    lr_schedule: Literal["cosine", "wsd"] = "cosine"  # cosine decay, or wsd: warmup, constant, linear cooldown
    cooldown_fraction: float = 0.2  # wsd: the last fraction of lr_decay_iters spent cooling down to min_lr
    weight_decay: float = 0.1  # AdamW's decoupled weight decay, on matrices and embeddings (not biases, norm gains)
    beta1: float = 0.9  # AdamW's first-moment decay
    beta2: float = 0.99  # AdamW's second-moment decay
    grad_clip: float = 1.0  # the largest gradient norm (larger ones are scaled down to it); 0 = no clipping
    optimizer: Literal["adamw", "muon"] = "adamw"  # muon: Muon for hidden matrices, AdamW for the rest
    muon_lr: float = 0.02  # Muon's peak learning rate (the schedule scales it like lr)
    # bfloat16 = autocast for matmuls; auto = bfloat16 where the device computes it natively (a GPU with bf16,
    # a CPU with AVX512-BF16 or AMX), else float32
    dtype: Literal["float32", "bfloat16", "auto"] = "float32"
    compile: bool = False  # torch.compile the model (training/compiling.py: on a CPU with inductor's C++ wrapper)
    seed: int = 1337  # the seed of the weights, the batches, dropout and sampling (a run is reproducible from it)
    threads: int | None = None  # torch intra-op threads, at most the usable cores; None = torch's default
    # CPU: split each batch into this many parts whose passes run at once, one thread each, gradients summed
    # in a fixed order (training/threaded.py); for small models whose kernels are too short to share out
    batch_threads: int = 1
    # attnlab's C++ kernels for float32 CPU training (attnlab/cpu/): a comma-separated subset of attention, gelu,
    # linear and scan, or all; each computes the same function as the layer it stands in for, faster; none = torch's
    kernels: str = "none"
    # "auto" = this process's GPU (cuda:LOCAL_RANK) when CUDA is visible, else the CPU; or cpu, cuda, cuda:N, mps
    device: str = "auto"
    # deterministic kernels (torch.use_deterministic_algorithms, for the whole process): on a GPU the
    # default kernels may add in a different order each run, so only this makes a resumed GPU run
    # bit-identical to an uninterrupted one (CPU runs are deterministic either way); slower
    deterministic: bool = False
    # CPU: treat subnormal floats (< 1.2e-38) as zero in every compute thread (FTZ/DAZ, for the whole
    # process): x86 handles them in microcode, and a peaky attention layer's gradients can slow the
    # step 1.5-2.5x with them (core/runtime.py)
    flush_denormal: bool = True
    # under torchrun: "ddp" = a full replica per process, gradients all-reduced; "fsdp" = fully
    # sharded (FSDP2): each process keeps 1/N of weights, gradients and optimiser state
    parallel: Literal["ddp", "fsdp"] = "ddp"
    # evaluation, logging, checkpoints
    eval_interval: int = 250  # steps between evaluations on the val split (and at the last step)
    eval_iters: int = 100  # batches per evaluation
    eval_batch_size: int | None = None  # sequences per evaluation batch; None = batch_size
    eval_train: bool = True  # also estimate the loss on the train split at each evaluation
    log_interval: int = 10  # steps between lines of train loss, lr and throughput (metrics.jsonl and the log)
    checkpoint_interval: int | None = None  # steps between checkpoints; None = at every evaluation
    keep_checkpoints: int = 2  # newest checkpoints kept in RUN/checkpoints/ (besides best/)
    resume: bool = False  # continue the run folder OUT_DIR/NAME from its newest valid checkpoint
    # numerical guards: a step whose loss or gradient norm is not finite is skipped (no update);
    # after max_nonfinite_steps such steps in a row the run stops, keeping the last good checkpoint
    on_nonfinite: Literal["skip", "stop"] = "skip"
    max_nonfinite_steps: int = 10  # on_nonfinite=skip: consecutive skipped steps after which the run stops
    progress: bool = True  # a progress bar on a terminal (plain lines when piped or false)
    mfu: bool = True  # log model FLOPs utilisation against a measured (cached) matmul peak
    # tensorboard: also event files in <run>/tensorboard; mlflow: also an MLflow run (params, metrics, plots)
    logger: Literal["none", "tensorboard", "mlflow"] = "none"
    # logger=mlflow: the tracking URI (sqlite:///mlflow.db, http://127.0.0.1:5000, ...); None =
    # MLFLOW_TRACKING_URI, else MLflow's own default (MLflow 3: ./mlflow.db, artifacts in ./mlruns)
    mlflow_uri: str | None = None
    profile_steps: int = 0  # > 0: record a torch profiler trace of this many steps (after 5 warm-up steps)
    sample_tokens: int = 300  # LM: tokens sampled at the end; mlm/seq2seq/caption: > 0 writes fixed samples; 0 = none
    sample_prompt: str = "\n"  # LM: the prompt of the sample written at the end
    model: ModelConfig = field(default_factory=GPTConfig)
    # task options, one section per task that has any (each a dataclass validated like the rest)
    images: ImageOptions = field(default_factory=ImageOptions)
    mlm: MLMOptions = field(default_factory=MLMOptions)
    classify: ClassifyOptions = field(default_factory=ClassifyOptions)
    seq2seq: Seq2SeqOptions = field(default_factory=Seq2SeqOptions)
    continuous: ContinuousOptions = field(default_factory=ContinuousOptions)

    def validate(self) -> None:
        """Range checks of every training option (the model's config validates itself); ConfigError naming the
        option."""
        positive = ("batch_size", "batch_threads", "grad_accum", "max_iters", "eval_interval", "eval_iters",
                    "log_interval", "keep_checkpoints", "bpe_vocab_size", "max_nonfinite_steps")
        for key in positive:
            if getattr(self, key) < 1:
                raise ConfigError(f"'{key}' must be >= 1, got {getattr(self, key)}")
        if self.tokenizer == "bpe" and self.bpe_vocab_size < BPE_MIN_VOCAB:  # before any data is read
            raise ConfigError(f"'bpe_vocab_size' must be >= {BPE_MIN_VOCAB} with tokenizer=bpe (its 256 bytes and "
                              f"at least one special token), got {self.bpe_vocab_size}")
        if self.bpe_vocab_size > MAX_VOCAB:  # the Rust trainer aborts the process on an absurd size
            raise ConfigError(f"'bpe_vocab_size' must be <= {MAX_VOCAB:,}, got {self.bpe_vocab_size:,}")
        for key in ("warmup_iters", "sample_tokens", "profile_steps"):
            if getattr(self, key) < 0:
                raise ConfigError(f"'{key}' must be >= 0, got {getattr(self, key)}")
        self.check_sizes()
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"'val_fraction' must be in (0, 1), got {self.val_fraction}")
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ConfigError(f"need 0 <= min_lr <= lr and lr > 0, got lr={self.lr}, min_lr={self.min_lr}")
        if not (0.0 <= self.beta1 < 1.0 and 0.0 <= self.beta2 < 1.0):
            raise ConfigError(f"beta1 and beta2 must be in [0, 1), got {self.beta1}, {self.beta2}")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise ConfigError("weight_decay and grad_clip must be >= 0")
        if self.muon_lr <= 0:
            raise ConfigError(f"'muon_lr' must be > 0, got {self.muon_lr}")
        if self.optimizer != "muon" and self.muon_lr != 0.02:
            raise ConfigError(f"'muon_lr' is used only with optimizer=muon (optimizer={self.optimizer})")
        if not 0.0 < self.cooldown_fraction <= 1.0:
            raise ConfigError(f"'cooldown_fraction' must be in (0, 1], got {self.cooldown_fraction}")
        if self.lr_schedule != "wsd" and self.cooldown_fraction != 0.2:
            raise ConfigError(f"'cooldown_fraction' is used only with lr_schedule=wsd (lr_schedule={self.lr_schedule})")
        if self.optimizer == "muon" and self.parallel == "fsdp":
            raise ConfigError("optimizer=muon needs whole weight matrices; use parallel=ddp (FSDP shards them)")
        if self.eval_batch_size is not None and self.eval_batch_size < 1:
            raise ConfigError(f"'eval_batch_size' must be >= 1, got {self.eval_batch_size}")
        if self.lr_decay_iters is not None and self.lr_decay_iters < 1:  # else the rate sits at min_lr throughout
            raise ConfigError(f"'lr_decay_iters' must be >= 1 (or unset: max_iters), got {self.lr_decay_iters}")
        if self.checkpoint_interval is not None and self.checkpoint_interval < 1:
            raise ConfigError(f"'checkpoint_interval' must be >= 1, got {self.checkpoint_interval}")
        if self.batch_size % self.batch_threads:
            raise ConfigError(f"'batch_size' ({self.batch_size}) must split into batch_threads={self.batch_threads} "
                              "equal parts")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"'threads' must be >= 1, got {self.threads}")
        if not DEVICE_SPEC.fullmatch(self.device):
            raise ConfigError(f"'device' must be auto, cpu, cuda, cuda:N or mps, got {self.device!r}")
        self.check_sections(task_name(self.task, self.model.family))  # an unknown task fails in task_name
        check_kernels(parse_kernels(self.kernels), self.model)
        if self.mlflow_uri is not None and (self.logger != "mlflow" or not self.mlflow_uri.strip()):
            raise ConfigError("'mlflow_uri' is used only with logger=mlflow" if self.logger != "mlflow" else
                              "'mlflow_uri' is empty (an unset shell variable?); give a tracking URI or leave it out")
        if self.logger in ("tensorboard", "mlflow"):
            import importlib.util

            from attnlab.core.extras import require

            if importlib.util.find_spec(self.logger) is None:  # looked up, not imported (MLflow takes seconds)
                require(self.logger, f"logger={self.logger}")  # one line naming the extra
        for key in ("data", "out_dir", "init_from"):  # `init_from=$RUN` with RUN unset trained from scratch
            if getattr(self, key) == "":
                raise ConfigError(f"'{key}' is empty (an unset shell variable?); give a path"
                                  + (" or leave it out" if key == "init_from" else ""))
        if self.name is not None and (not self.name or "/" in self.name or self.name.startswith(".")):
            raise ConfigError(f"'name' must be a plain folder name, got {self.name!r}")

    def check_sizes(self) -> None:
        """ConfigError where a count the user sets would keep the run going for days: an evaluation of more than
        ``MAX_EVAL_ITERS`` batches or ``MAX_EVAL_TOKENS`` tokens (eval_iters x eval batch x block_size), more than
        ``MAX_SAMPLE_TOKENS`` tokens sampled at the end, more than ``MAX_PROFILE_STEPS`` profiled steps; and a folder
        name in ``out_dir`` or ``name`` longer than a file system takes (``MAX_NAME_BYTES``)."""
        if self.eval_iters > MAX_EVAL_ITERS:
            raise ConfigError(f"'eval_iters' must be <= {MAX_EVAL_ITERS:,} (batches per evaluation), got "
                              f"{self.eval_iters:,}")
        batch = self.eval_batch_size or self.batch_size
        per_batch = batch * getattr(self.model, "block_size", 1)
        tokens = self.eval_iters * per_batch
        if tokens > MAX_EVAL_TOKENS and per_batch <= MAX_EVAL_TOKENS:  # a batch too big alone: check_fits names it
            raise ConfigError(f"an evaluation would read {tokens:,} tokens (eval_iters={self.eval_iters:,} x "
                              f"{batch:,} examples x block_size {getattr(self.model, 'block_size', 1):,}); at most "
                              f"{MAX_EVAL_TOKENS:,}: lower eval_iters")
        if self.sample_tokens > MAX_SAMPLE_TOKENS:
            raise ConfigError(f"'sample_tokens' must be <= {MAX_SAMPLE_TOKENS:,} (tokens sampled at the end), got "
                              f"{self.sample_tokens:,}; sample more with attnlab sample RUN --max-new-tokens N")
        if self.profile_steps > MAX_PROFILE_STEPS:
            raise ConfigError(f"'profile_steps' must be <= {MAX_PROFILE_STEPS}, got {self.profile_steps:,}")
        for key in ("out_dir", "name"):
            long = [part for part in re.split(r"[/\\]", getattr(self, key) or "")
                    if len(part.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES]
            if long:
                raise ConfigError(f"'{key}' holds a folder name of {len(long[0].encode('utf-8', 'surrogateescape'))} "
                                  f"bytes ({long[0][:40]}...); a folder name is at most {MAX_NAME_BYTES} bytes: choose "
                                  "a shorter one")

    def check_sections(self, task: str) -> None:
        """ConfigError where a section of task options that ``task`` never reads is set away from its defaults
        (``seq2seq.min_len=1`` on a language model, also written ``min_len=1``, used to train without it), and
        where a task without text is given a tokenizer; first, a family the task does not train."""
        check_family(task, self.model.family)
        check_head(task, self.model)
        for key in ("tokenizer", "bpe_vocab_size"):
            if task not in TOKENIZED and getattr(self, key) != getattr(TrainConfig, key):
                raise ConfigError(f"'{key}' is not used: task {task} reads no text (tasks {', '.join(TOKENIZED)} do)")
        for section in SECTIONS:
            if section in TASK_SECTIONS[task]:
                continue
            options = getattr(self, section)
            default = type(options)()
            for f in dataclasses.fields(options):
                if getattr(options, f.name) != getattr(default, f.name):
                    readers = sorted(t for t, s in TASK_SECTIONS.items() if section in s)
                    raise ConfigError(f"'{section}.{f.name}' is not used: task {task} reads no {section} options "
                                      f"(task {' or '.join(readers)} does)")


def check_kernels(kernels: tuple[str, ...], model: ModelConfig) -> None:
    """ConfigError, before any data is read, where one of ``kernels`` has no layer of ``model`` to compute: each
    computes one function of the specification (the attention kernel, causal self-attention in place of the sdpa
    route; gelu, the exact GELU; linear, the blocks' products on widths of multiples of 16; scan, the SSM's)."""
    options = model.defaults()
    for kernel in kernels:
        key = f"kernels={kernel}"
        if kernel in ("attention", "gelu", "linear") and "d_model" not in options:
            raise ConfigError(f"{key}: family {model.family} has no attention or feed-forward layers; leave it out")
        if kernel == "attention":
            if getattr(model, "mixer", "attention") == "ssm":
                raise ConfigError(f"{key}: mixer=ssm has no attention; leave attention out of kernels")
            if model.attn_backend != "sdpa":
                raise ConfigError(f"{key} stands in for attn_backend=sdpa, and model.attn_backend="
                                  f"{model.attn_backend}; leave attention out of kernels or use attn_backend=sdpa")
            check_route("cpu-fused", model.attention_needs(), model.head_dim, key)
        if kernel == "gelu" and model.activation != "gelu":
            raise ConfigError(f"{key} computes the exact GELU, and model.activation={model.activation}; leave it out")
        if kernel == "linear" and model.d_model % 16:
            raise ConfigError(f"{key} computes widths that are multiples of 16, and model.d_model={model.d_model}; "
                              "leave it out")
        if kernel == "scan" and getattr(model, "mixer", "attention") not in ("ssm", "hybrid"):
            raise ConfigError(f"{key} computes the selective scan of an SSM, and this model has none (model.mixer="
                              f"{getattr(model, 'mixer', 'attention')}); leave it out")
