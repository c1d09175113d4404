"""Audio -> one feature vector per 10 ms: log-mel frames (librosa, the ``[audio]`` extra), and WAV folders
as data for the feature-sequence encoders.

A clip x (samples at any rate, mono or averaged to mono) is resampled to 16 kHz, cropped or zero-padded
to ``seconds`` (centred), and framed with a 25 ms Hann window every 10 ms (400 / 160 samples):

    S[m, t] = sum_k M[m, k] |STFT(x)[k, t]|^2        M: n_mels triangular mel filters, 0-8 kHz
    F[t, m] = log(S[m, t] + 1e-6)                     (T, n_mels), T = 1 + seconds * 100
    G[t, m] = F[t, m] - mean_t F[:, m]                 per-utterance mean normalisation (per band)
    F~ = G / std(G)                                   and variance normalisation (one scale per clip)

A WAV folder is ``ROOT/<class>/*.wav`` (the split is then drawn by ``continuous.test_fraction``) or
``ROOT/train/<class>/*.wav`` + ``ROOT/test/<class>/*.wav`` (the test folder is the held-out split).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.core.errors import DataError
from attnlab.core.extras import require

SAMPLE_RATE = 16_000
WINDOW, HOP = 400, 160  # 25 ms, 10 ms at 16 kHz
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")
# the clips read: a sample rate a recording has (a header saying 1 Hz would resample 400 KB into 13 GB), and at
# most 10 minutes (9.6M samples at 16 kHz) before the clip is cropped to its ``seconds``
MIN_RATE, MAX_RATE = 1_000, 384_000
MAX_SECONDS = 600
MAX_DECODED = 2**27  # samples of all channels decoded from one file (512 MB as float32)


@dataclass(frozen=True)
class FrontEnd:
    """How audio becomes frames; saved with a run so ``predict`` reads new audio the same way."""

    seconds: float = 1.0
    n_mels: int = 40

    def validate(self) -> None:
        """Range checks: 0.1 <= seconds <= 30, 8 <= n_mels <= 128 (DataError)."""
        if not 0.1 <= self.seconds <= 30:
            raise DataError(f"audio clips must be 0.1..30 seconds, got {self.seconds}")
        if not 8 <= self.n_mels <= 128:
            raise DataError(f"n_mels must be 8..128, got {self.n_mels}")

    @property
    def n_frames(self) -> int:
        """T = 1 + samples // hop (librosa's centred frames)."""
        return 1 + round(self.seconds * SAMPLE_RATE) // HOP


def fit_length(x: np.ndarray, n: int) -> np.ndarray:
    """Centre-crop or symmetrically zero-pad x (samples,) to n samples."""
    if len(x) >= n:
        start = (len(x) - n) // 2
        return x[start:start + n]
    left = (n - len(x)) // 2
    return np.pad(x, (left, n - len(x) - left))


def check_clip(n_samples: int, rate: int, what: str = "the clip") -> None:
    """DataError naming ``what`` unless ``rate`` is in MIN_RATE..MAX_RATE Hz and the clip at most MAX_SECONDS long:
    checked before anything is resampled or allocated."""
    if not MIN_RATE <= rate <= MAX_RATE:
        raise DataError(f"{what} has a sample rate of {rate:,} Hz; attnlab reads audio at {MIN_RATE:,} to "
                        f"{MAX_RATE:,} Hz")
    if n_samples > MAX_SECONDS * rate:
        raise DataError(f"{what} lasts {n_samples / rate:,.0f} s; attnlab reads clips of at most {MAX_SECONDS} s "
                        "(cut it first)")


def log_mel(x: np.ndarray, rate: int, front: FrontEnd = FrontEnd()) -> np.ndarray:
    """Samples (n,) at ``rate`` Hz -> normalised log-mel frames (T, n_mels) float32 (equations above)."""
    librosa = require("librosa", "audio features")
    x = np.asarray(x, dtype=np.float32)
    check_clip(len(x), rate)
    if rate != SAMPLE_RATE:
        x = librosa.resample(x, orig_sr=rate, target_sr=SAMPLE_RATE)
    x = fit_length(x, round(front.seconds * SAMPLE_RATE))
    mel = librosa.feature.melspectrogram(y=x, sr=SAMPLE_RATE, n_fft=512, win_length=WINDOW, hop_length=HOP,
                                         n_mels=front.n_mels, fmax=SAMPLE_RATE / 2, power=2.0)
    f = np.log(mel + 1e-6).T  # (T, n_mels)
    g = f - f.mean(0, keepdims=True)
    f = g / max(float(g.std()), 1e-6)
    return f.astype(np.float32)


def read_audio(path: Path) -> tuple[np.ndarray, int]:
    """A sound file -> (mono samples (n,) float32, sample rate); DataError when it cannot be decoded, or when its
    header gives a rate, a length or a size beyond the bounds above (``check_clip``, ``MAX_DECODED``)."""
    sf = require("soundfile", "reading audio files")
    try:
        info = sf.info(str(path))  # the header: checked before the samples are decoded
        check_clip(info.frames, info.samplerate, str(path))
        if info.frames * info.channels > MAX_DECODED:  # a compressed file of silence decodes into gigabytes
            raise DataError(f"{path} holds {info.frames * info.channels:,} samples ({info.channels} channels); "
                            f"attnlab decodes at most {MAX_DECODED:,} (cut it or mix it down first)")
        x, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (RuntimeError, sf.LibsndfileError, OSError) as e:
        raise DataError(f"cannot read audio {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if len(x) == 0:
        raise DataError(f"{path} holds no samples")
    return x.mean(1), int(rate)


def write_wav(path: Path, x: np.ndarray, rate: int) -> None:
    """float samples in [-1, 1] -> a 16-bit PCM WAV file."""
    sf = require("soundfile", "writing audio files")
    sf.write(str(path), np.clip(x, -1, 1), rate, subtype="PCM_16")


def audio_files(folder: Path) -> list[Path]:
    """The audio files directly in ``folder``, sorted."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES)


def is_audio_folder(path: Path) -> bool:
    """True when ``path`` is ROOT/<class>/*.wav or ROOT/{train,test}/<class>/*.wav."""
    if not path.is_dir():
        return False
    root = path / "train" if (path / "train").is_dir() else path
    return any(d.is_dir() and audio_files(d) for d in root.iterdir())


def read_audio_folder(path: Path, front: FrontEnd = FrontEnd()) -> tuple[np.ndarray, list[str], np.ndarray | None]:
    """A WAV folder -> (frames (N, T, n_mels), class names (N,), held-out mask (N,) or None when unsplit)."""
    front.validate()
    splits = [("train", path / "train"), ("test", path / "test")] if (path / "train").is_dir() else [("all", path)]
    if splits[0][0] == "train" and not splits[1][1].is_dir():
        raise DataError(f"{path} has train/ but no test/ folder")
    feats, names, held = [], [], []
    for split, root in splits:
        classes = sorted(d for d in root.iterdir() if d.is_dir())
        for d in classes:
            for f in audio_files(d):
                x, rate = read_audio(f)
                feats.append(log_mel(x, rate, front))
                names.append(d.name)
                held.append(split == "test")
    if not feats:
        raise DataError(f"{path} holds no audio files in class folders (ROOT/<class>/*.wav)")
    if len(set(names)) < 2:
        raise DataError(f"{path}: every clip is in class '{names[0]}'; a classifier needs >= 2 class folders")
    mask = np.array(held) if splits[0][0] == "train" else None
    if mask is not None and (mask.all() or not mask.any()):
        raise DataError(f"{path}: train/ and test/ must both hold audio files")
    return np.stack(feats), names, mask
