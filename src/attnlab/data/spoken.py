"""Spoken keywords synthesised offline with eSpeak NG: the ten command words of the Speech Commands set,
spoken by many voices at many speeds and pitches, shifted in time and buried in noise.

Clip i (1 s at 16 kHz) of ``generate(n, seed)``:

    word   w_i ~ uniform over WORDS (the first ten clips of each split take the ten words in turn, so
           every word is in both splits)
    voice  an accent (6 English dialects) + a speaker variant; the held-out split uses speaker
           variants never heard in training (TEST_VARIANTS), so test accuracy measures new speakers
    speech s = eSpeak(w_i, voice, rate ~ U[120, 240] words/min, pitch ~ U[20, 80]), resampled to 16 kHz,
           gain ~ U[0.3, 1], placed at a uniform offset inside the second
    noise  x = s + sigma n,  n = white or brown (integrated white) noise scaled to unit power,
           sigma set by SNR ~ U[-5, 20] dB relative to the speech's power

Features are ``audio.log_mel`` frames: (N, 101, 40) for the encoders, kept on disk after their first use
(synthesis and frames of the presets' 4,000 clips take ~40 s on a 2-core CPU). ``write_folder`` writes the same
clips as ``train/<word>/*.wav`` and ``test/<word>/*.wav`` for users and other tools.
"""

from __future__ import annotations

import functools
import json
import zipfile
from importlib import metadata
from pathlib import Path

import numpy as np

from attnlab.core.errors import DataError
from attnlab.core.fileio import atomic_path, default_cache_dir
from attnlab.core.resources import check_room
from attnlab.core.staging import staged_folder
from attnlab.data.audio import SAMPLE_RATE, FrontEnd, log_mel, write_wav

WORDS = ("yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go")
DIALECTS = ("en", "en-us", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us-nyc")
TRAIN_VARIANTS = ("m1", "m2", "m3", "m4", "m5", "f1", "f2", "f3", "klatt", "klatt3", "adam", "linda", "paul",
                  "steph", "robert", "annie")
TEST_VARIANTS = ("m6", "m7", "f4", "f5", "john", "belinda")
RATE, PITCH, SNR_DB, GAIN = (120, 240), (20, 80), (-5.0, 20.0), (0.3, 1.0)
CACHE_VERSION = 1  # of the features kept on disk: raise it when generate() or log_mel() compute anything else


def speech(items: list[tuple[str, str, int, int]]) -> list[np.ndarray]:
    """(word, voice, rate, pitch) per clip -> eSpeak NG's samples resampled to 16 kHz (reproducible)."""
    from attnlab.core.extras import require
    from attnlab.data import espeak

    librosa = require("librosa", "spoken-word synthesis")
    require("espeakng_loader", "spoken-word synthesis")
    waves, rate = espeak.synthesize_many(items)
    return [librosa.resample(x, orig_sr=rate, target_sr=SAMPLE_RATE) for x in waves]


def _noise(rng: np.random.Generator, n: int) -> np.ndarray:
    """Unit-power white or brown noise (n,)."""
    z = rng.standard_normal(n)
    if rng.random() < 0.5:
        z = np.cumsum(z)
        z -= np.linspace(z[0], z[-1], n)  # remove the drift so the clip starts and ends near zero
    return z / max(float(np.sqrt((z ** 2).mean())), 1e-9)


def place(s: np.ndarray, rng: np.random.Generator, seconds: float = 1.0) -> np.ndarray:
    """Speech s (16 kHz) -> one noisy clip (seconds * 16000,) float32: gain, offset and noise as above."""
    s = s * rng.uniform(*GAIN) / max(float(np.abs(s).max()), 1e-9)
    n = round(seconds * SAMPLE_RATE)
    if len(s) > n:
        s = s[:n]
    x = np.zeros(n, np.float64)
    start = int(rng.integers(0, n - len(s) + 1))
    x[start:start + len(s)] = s
    power = float((s ** 2).mean())
    sigma = np.sqrt(power / 10 ** (rng.uniform(*SNR_DB) / 10))
    return np.clip(x + sigma * _noise(rng, n), -1, 1).astype(np.float32)


@functools.lru_cache(maxsize=2)
def generate(n: int, seed: int = 0, test_fraction: float = 0.2) -> tuple[np.ndarray, list[str], np.ndarray, tuple]:
    """n clips -> (waves (n, 16000) float32, words (n,), held-out mask (n,), voices (n,)); the last
    round(test_fraction n) clips are spoken by TEST_VARIANTS, the rest by TRAIN_VARIANTS."""
    if n < 20:
        raise DataError(f"generated spoken words need n >= 20, got {n}")
    if seed < 0:
        raise DataError(f"the spoken-word seed must be >= 0, got {seed}")
    check_room(f"{n:,} spoken-word clips", memory=2 * n * SAMPLE_RATE * 4,  # the float32 waves, then stacked
               advice="use a smaller --n", error=DataError)
    rng = np.random.default_rng(seed)
    n_test = max(len(WORDS), round(test_fraction * n))
    items, words, voices = [], [], []
    for i in range(n):
        held = i >= n - n_test
        word = WORDS[i % len(WORDS)] if i < len(WORDS) or (held and i - (n - n_test) < len(WORDS)) \
            else WORDS[int(rng.integers(len(WORDS)))]
        variants = TEST_VARIANTS if held else TRAIN_VARIANTS
        voice = f"{DIALECTS[int(rng.integers(len(DIALECTS)))]}+{variants[int(rng.integers(len(variants)))]}"
        items.append((word, voice, int(rng.integers(*RATE)), int(rng.integers(*PITCH))))
        words.append(word)
        voices.append(voice)
    waves = [place(s, rng) for s in speech(items)]
    held_mask = np.arange(n) >= n - n_test
    return np.stack(waves), words, held_mask, tuple(voices)


def features(n: int, seed: int = 0, front: FrontEnd | None = None) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Log-mel frames of ``generate(n, seed)``: (n, T, n_mels) float32, words, held-out mask (n,) bool. Kept in
    the attnlab cache folder, by (n, seed, front end, CACHE_VERSION and the versions of the eSpeak NG loader
    and librosa, which make the sound and the frames); a file that cannot be read is computed again."""
    front = front or FrontEnd()
    file = _cache_file(n, seed, front)
    if file is not None and file.is_file():
        try:
            with np.load(file) as z:
                return z["x"], [str(w) for w in z["words"]], z["held"]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            pass  # damaged: computed again below, and replaced
    waves, words, held, _ = generate(n, seed)
    x = np.stack([log_mel(w, SAMPLE_RATE, front) for w in waves])
    if file is not None:
        try:
            with atomic_path(file) as tmp, open(tmp, "wb") as f:  # a unique temporary file: processes may race
                np.savez(f, x=x, words=np.array(words), held=held)
        except OSError:
            pass  # a read-only cache folder: the features are just not kept
    return x, words, held


def _cache_file(n: int, seed: int, front: FrontEnd) -> Path | None:
    """Where ``features(n, seed, front)`` is kept, or None without the packages that make it."""
    try:
        made_by = f"espeak{metadata.version('espeakng-loader')}-librosa{metadata.version('librosa')}"
    except metadata.PackageNotFoundError:
        return None  # generate() says which extra is missing
    name = f"spoken-v{CACHE_VERSION}-{n}-{seed}-{front.seconds:g}s-{front.n_mels}mel-{made_by}.npz"
    return default_cache_dir() / "spoken" / name


def write_folder(out: Path, n: int, seed: int = 0) -> dict:
    """Write ``generate(n, seed)`` as out/{train,test}/<word>/<i>.wav and out/clips.jsonl (word, voice,
    split); returns the counts."""
    check_room(f"{n:,} clips of 1 s (16-bit WAV)", disk=n * (2 * SAMPLE_RATE + 44), where=out,
               advice="use a smaller --n", error=DataError)
    waves, words, held, voices = generate(n, seed)
    records = []
    with staged_folder(out, DataError) as staging:  # a kill leaves no out or all of it, never a part
        for i, (x, word, h, voice) in enumerate(zip(waves, words, held, voices, strict=True)):
            split = "test" if h else "train"
            folder = staging / split / word
            folder.mkdir(parents=True, exist_ok=True)
            write_wav(folder / f"{i:05d}.wav", x, SAMPLE_RATE)
            records.append({"file": f"{split}/{word}/{i:05d}.wav", "word": word, "voice": voice, "split": split})
        (staging / "clips.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return {"train": int((~held).sum()), "test": int(held.sum()), "words": len(WORDS)}
